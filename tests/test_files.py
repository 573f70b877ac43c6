"""compiler/files.py: the project's one atomic write (its modes under a umask,
through symlinks), file hash, and the cache root (compiler/build/cache.py). Real files."""
import hashlib
import os
import stat

import pytest

from compiler import files
from compiler.build import cache


def test_a_failed_write_leaves_the_earlier_file_whole(tmp_path):
    path = tmp_path / 'weights.npz'
    path.write_bytes(b'earlier')

    with pytest.raises(OSError, match='disk full'):
        with files.atomic_write(path) as f:
            f.write(b'partial')
            raise OSError('disk full')
    assert path.read_bytes() == b'earlier'
    assert list(tmp_path.iterdir()) == [path], 'the temp file should be removed'


def test_a_finished_write_replaces_the_file(tmp_path):
    path = tmp_path / 'out.txt'
    path.write_text('old')
    files.write_atomically(path, 'new')
    assert path.read_text() == 'new'
    assert list(tmp_path.iterdir()) == [path]


def test_sha256_file(tmp_path):
    path = tmp_path / 'blob'
    path.write_bytes(b'x' * 100_000)
    assert files.sha256_file(path) == hashlib.sha256(b'x' * 100_000).hexdigest()


def test_the_cache_root_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv('MICROGRAD_CACHE_DIR', str(tmp_path / 'mine'))
    assert cache.cache_root() == str(tmp_path / 'mine')
    monkeypatch.delenv('MICROGRAD_CACHE_DIR')
    monkeypatch.setenv('XDG_CACHE_HOME', str(tmp_path / 'xdg'))
    assert cache.cache_root() == str(tmp_path / 'xdg' / 'micrograd-compiler')
    monkeypatch.delenv('XDG_CACHE_HOME')
    monkeypatch.setenv('HOME', str(tmp_path / 'home'))
    assert cache.cache_root() == str(tmp_path / 'home' / '.cache' / 'micrograd-compiler')


@pytest.fixture
def umask():
    """Sets the process's umask for a test (``umask(0o027)``), and restores it."""
    old = os.umask(0o022)
    yield os.umask
    os.umask(old)


def mode(path):
    return stat.S_IMODE(os.stat(path).st_mode)


@pytest.mark.parametrize('mask', [0o022, 0o027, 0o077], ids=oct)
def test_current_umask_reads_the_umask_and_keeps_it(umask, mask, monkeypatch):
    umask(mask)
    assert files.current_umask() == mask
    monkeypatch.setattr(files, 'PROC_STATUS', '/nonexistent/status')     # the fallback
    assert files.current_umask() == mask
    assert os.umask(mask) == mask, 'reading the umask must leave it as it was'


@pytest.mark.parametrize('mask, expected', [(0o022, 0o644), (0o027, 0o640)], ids=['022', '027'])
def test_a_written_file_gets_the_umasks_permissions(tmp_path, umask, mask, expected):
    umask(mask)
    files.write_atomically(tmp_path / 'new.txt', 'new')
    (tmp_path / 'old.txt').write_text('old')
    (tmp_path / 'old.txt').chmod(0o600)
    with files.atomic_write(tmp_path / 'old.txt') as f:
        f.write(b'replaced')
    assert mode(tmp_path / 'new.txt') == expected
    assert mode(tmp_path / 'old.txt') == expected, 'a replaced file gets the mode a new one would'
    assert (tmp_path / 'old.txt').read_bytes() == b'replaced'


@pytest.mark.parametrize('mask', [0o022, 0o027], ids=oct)
def test_a_private_file_is_for_its_owner_only(tmp_path, umask, mask):
    umask(mask)
    with files.atomic_write(tmp_path / 'secret', private=True) as f:
        f.write(b'mine')
    assert mode(tmp_path / 'secret') == 0o600


def test_writing_through_a_symlink_replaces_its_target(tmp_path, umask):
    umask(0o022)
    here, there = tmp_path / 'here', tmp_path / 'there'
    here.mkdir()
    there.mkdir()
    link, target = here / 'weights.npz', there / 'w.npz'
    target.write_bytes(b'earlier')
    link.symlink_to(target)
    with files.atomic_write(link) as f:
        f.write(b'new')
    assert link.is_symlink() and os.readlink(link) == str(target), 'the link must stay a link'
    assert target.read_bytes() == b'new' and mode(target) == 0o644
    assert list(here.iterdir()) == [link] and list(there.iterdir()) == [target], 'no temporary file left'


def test_a_relative_symlink_chain_and_a_dangling_link(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / 'store').mkdir()
    os.symlink('store/final.txt', 'middle')          # dangling: its target does not exist yet
    os.symlink('middle', 'first')
    files.write_atomically('first', 'through two links')
    assert (tmp_path / 'store' / 'final.txt').read_text() == 'through two links'
    assert os.readlink('first') == 'middle' and os.readlink('middle') == 'store/final.txt'


def test_a_failed_write_through_a_symlink_leaves_the_target_whole(tmp_path):
    (tmp_path / 'store').mkdir()
    target, link = tmp_path / 'store' / 'w.npz', tmp_path / 'w.npz'
    target.write_bytes(b'earlier')
    link.symlink_to(target)
    with pytest.raises(OSError, match='disk full'):
        with files.atomic_write(link) as f:
            f.write(b'partial')
            raise OSError('disk full')
    assert target.read_bytes() == b'earlier' and link.is_symlink()
    assert list((tmp_path / 'store').iterdir()) == [target]
