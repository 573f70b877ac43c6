"""An unusable build cache is a clear error, or a fallback, never a raw OSError
(issue 13, item 12).

A ``$MICROGRAD_CACHE_DIR`` the user chose that cannot be used raises
``CacheError`` naming it and what to do; the default folder being unusable
makes builds fall back to a private temporary folder with one warning per
process. Read-only and full disks are real: tmpfs mounts (root only; as root,
permission bits do not stop writes), skipped where mounting is not allowed.
"""
import contextlib
import os
import subprocess
import warnings

import pytest

import compiler
from compiler.build import cache
from compiler.build import BuildError, CacheError
from micrograd import Value

from tests.differential import COMPILERS, FAST_CC, needs_cc
from tests.test_build import assert_explains, assert_nothing_half_written, compile_tiny


@contextlib.contextmanager
def tmpfs(path, size='1m', ro=False):
    """A real tmpfs of ``size`` mounted at ``path`` (mode 0700), read-only if ``ro``."""
    path.mkdir(exist_ok=True)
    options = f'size={size},mode=0700' + (',ro' if ro else '')
    r = subprocess.run(['mount', '-t', 'tmpfs', '-o', options, 'tmpfs', str(path)],
                       capture_output=True, text=True)
    if r.returncode:
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.strip()}")
    try:
        yield path
    finally:
        if subprocess.run(['umount', str(path)], capture_output=True).returncode:
            subprocess.run(['umount', '-l', str(path)], capture_output=True)


def remount_read_only(path):
    subprocess.run(['mount', '-o', 'remount,ro', str(path)], check=True, capture_output=True)


@pytest.fixture
def chosen(monkeypatch):
    """Point ``$MICROGRAD_CACHE_DIR`` at a path."""
    monkeypatch.delenv('MICROGRAD_CACHE', raising=False)
    return lambda path: monkeypatch.setenv('MICROGRAD_CACHE_DIR', str(path))


@pytest.fixture
def default_cache(monkeypatch):
    """No ``$MICROGRAD_CACHE_DIR``: the default folder, under ``$HOME`` or
    ``$XDG_CACHE_HOME``; and the once-per-process warning not yet given."""
    monkeypatch.delenv('MICROGRAD_CACHE_DIR', raising=False)
    monkeypatch.delenv('MICROGRAD_CACHE', raising=False)
    monkeypatch.delenv('XDG_CACHE_HOME', raising=False)
    monkeypatch.setattr(cache, '_fallback_warned', False)
    return monkeypatch


def other_graph(c):
    x, w = Value(0.0), Value(2.0)
    return compiler.compile((x * w + c).tanh(), [x], [w], cc=FAST_CC)


def assert_says_what_to_do(error, path):
    assert_explains(error, f'the build cache folder {path} cannot be used', 'MICROGRAD_CACHE_DIR')
    assert isinstance(error, BuildError) and not isinstance(error, OSError)


def test_cache_error_is_a_build_error():
    assert issubclass(CacheError, BuildError)


# -- a folder the user chose -----------------------------------------------------------------

@needs_cc
def test_a_chosen_cache_on_a_read_only_file_system_is_a_cache_error(tmp_path, chosen):
    with tmpfs(tmp_path / 'ro', ro=True) as folder:
        chosen(folder)
        with pytest.raises(CacheError) as e:
            compile_tiny(cc=FAST_CC)
    assert_says_what_to_do(e.value, folder)
    assert_explains(e.value, 'Read-only file system', 'MICROGRAD_CACHE=0')


@needs_cc
def test_a_read_only_cache_still_serves_the_builds_it_holds(tmp_path, chosen):
    with tmpfs(tmp_path / 'cache', size='4m') as folder:
        chosen(folder)
        built = compile_tiny(cc=FAST_CC)
        remount_read_only(folder)
        again = compile_tiny(cc=FAST_CC)
        assert again.build.cached and again.build.path == built.build.path
        with pytest.raises(CacheError) as e:       # a new graph cannot be added
            other_graph(2.0)
    assert_says_what_to_do(e.value, folder)


@needs_cc
def test_a_chosen_cache_that_is_a_file_is_a_cache_error(tmp_path, chosen):
    path = tmp_path / 'cache'
    path.write_text('not a folder')
    chosen(path)
    with pytest.raises(CacheError) as e:
        compile_tiny(cc=FAST_CC)
    assert_says_what_to_do(e.value, path)
    assert_explains(e.value, 'it is a file, not a folder')
    chosen(path / 'below')                              # a path through a regular file
    with pytest.raises(CacheError) as e:
        compile_tiny(cc=FAST_CC)
    assert_says_what_to_do(e.value, path / 'below')
    assert_explains(e.value, 'a part of its path is a file')


def source_pages():
    """The size of a tmpfs that holds the tiny graph's source and 8 KiB more."""
    x, w = Value(0.0), Value(2.0)
    old = os.environ.get('MICROGRAD_CACHE')
    os.environ['MICROGRAD_CACHE'] = '0'
    try:
        n = len(compiler.compile((x * w + 1.0).tanh(), [x], [w], cc=FAST_CC).source.encode())
    finally:
        os.environ.pop('MICROGRAD_CACHE') if old is None else os.environ.update(MICROGRAD_CACHE=old)
    return (n + 4095) // 4096 * 4 + 8


@needs_cc
@pytest.mark.parametrize('cc', COMPILERS)
def test_a_full_disk_is_a_cache_error_not_a_fault_of_the_generated_c(cc, tmp_path, chosen):
    """The source fits, the shared object does not: gcc and clang's linker
    fail with ENOSPC, tcc exits 0 with a truncated object."""
    with tmpfs(tmp_path / 'small', size=f'{source_pages()}k') as folder:
        chosen(folder)
        with pytest.raises(CacheError) as e:
            compile_tiny(cc=cc)
        assert_nothing_half_written(str(folder))
    assert_explains(e.value, 'ran out of disk space', str(folder), 'cache --clear', 'C source kept at')
    assert 'please report' not in str(e.value)


@needs_cc
def test_a_cache_too_full_for_the_source_is_a_cache_error(tmp_path, chosen):
    with tmpfs(tmp_path / 'tiny', size='8k') as folder:
        chosen(folder)
        with pytest.raises(CacheError) as e:
            compile_tiny(cc=FAST_CC)
    assert_says_what_to_do(e.value, folder)
    assert_explains(e.value, 'the disk is full')


# -- the default folder falls back ---------------------------------------------------------

def assert_fell_back_once(record, *models):
    for m in models:
        assert m.build.temporary and not m.build.cached
        m.set_input([0.5])
        m.forward()
    fallbacks = [w for w in record if issubclass(w.category, UserWarning)
                 and 'temporary folder' in str(w.message)]
    assert len(fallbacks) == 1, [str(w.message) for w in record]
    return str(fallbacks[0].message)


@needs_cc
def test_no_home_folder_falls_back_to_a_temporary_build_with_one_warning(tmp_path, default_cache):
    default_cache.setenv('HOME', str(tmp_path / 'gone'))
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter('always')
        models = [compile_tiny(cc=FAST_CC), other_graph(3.0)]
    message = assert_fell_back_once(record, *models)
    assert str(tmp_path / 'gone') in message and 'MICROGRAD_CACHE_DIR' in message
    assert not (tmp_path / 'gone').exists()


@needs_cc
def test_a_read_only_home_falls_back_to_a_temporary_build(tmp_path, default_cache):
    with tmpfs(tmp_path / 'home', ro=True) as home:
        default_cache.setenv('HOME', str(home))
        with warnings.catch_warnings(record=True) as record:
            warnings.simplefilter('always')
            models = [compile_tiny(cc=FAST_CC), other_graph(4.0)]
    message = assert_fell_back_once(record, *models)
    assert 'Read-only file system' in message


@needs_cc
def test_a_full_default_cache_falls_back_to_a_temporary_build(tmp_path, default_cache):
    with tmpfs(tmp_path / 'xdg', size=f'{source_pages()}k') as xdg:
        default_cache.setenv('XDG_CACHE_HOME', str(xdg))
        with warnings.catch_warnings(record=True) as record:
            warnings.simplefilter('always')
            models = [compile_tiny(cc=FAST_CC), other_graph(5.0)]
    assert_fell_back_once(record, *models)


@needs_cc
def test_a_default_cache_path_through_a_file_falls_back(tmp_path, default_cache):
    (tmp_path / 'file').write_text('x')
    default_cache.setenv('XDG_CACHE_HOME', str(tmp_path / 'file'))
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter('always')
        models = [compile_tiny(cc=FAST_CC)]
    assert_fell_back_once(record, *models)
