"""compiler/files.py: the project's one atomic write, file hash and cache root."""
import hashlib

import pytest

from compiler import files


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
    assert files.cache_root() == str(tmp_path / 'mine')
    monkeypatch.delenv('MICROGRAD_CACHE_DIR')
    monkeypatch.setenv('XDG_CACHE_HOME', str(tmp_path / 'xdg'))
    assert files.cache_root() == str(tmp_path / 'xdg' / 'micrograd-compiler')
    monkeypatch.delenv('XDG_CACHE_HOME')
    monkeypatch.setenv('HOME', str(tmp_path / 'home'))
    assert files.cache_root() == str(tmp_path / 'home' / '.cache' / 'micrograd-compiler')
