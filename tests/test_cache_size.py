"""The build cache is capped, least recently used entries going first (issue 13, item 6),
and ``python -m compiler cache`` shows and empties it."""
import os
import subprocess
import sys
import time

import pytest

from compiler.build import cache, toolchain
from compiler.build import CacheError, build_extension, cache_max, default_flags, find_compiler
from compiler.build.cache import cache_entries, evict, parse_size

from tests.differential import FAST_CC, needs_cc
from tests.test_build import REPO, fresh_cache  # noqa: F401
from tests.test_build_verify import graph_a, graph_b, source_of


def test_sizes_are_read_with_their_units():
    assert parse_size('1024') == 1024
    assert parse_size('500M') == 500 << 20
    assert parse_size('2G') == parse_size('2g') == parse_size('2GiB') == parse_size(' 2 GB ') == 2 << 30
    assert parse_size('1.5G') == 3 << 29
    assert parse_size('64k') == parse_size('64KiB') == 64 << 10
    assert parse_size('0') == 0
    for bad in ('', 'lots', '-1G', '2X', '1e9', 'G', '5 M B'):
        with pytest.raises(ValueError):
            parse_size(bad)


def test_the_cap_comes_from_the_environment(monkeypatch):
    monkeypatch.delenv('MICROGRAD_CACHE_MAX', raising=False)
    assert cache_max() == 1 << 30
    monkeypatch.setenv('MICROGRAD_CACHE_MAX', '500M')
    assert cache_max() == 500 << 20
    monkeypatch.setenv('MICROGRAD_CACHE_MAX', 'a lot')
    with pytest.raises(CacheError, match='MICROGRAD_CACHE_MAX'):
        cache_max()


def make_entry(root, key, sizes, age):
    """Files of an entry with the given sizes, last used ``age`` seconds ago."""
    for suffix, size in sizes.items():
        path = os.path.join(root, key + suffix)
        with open(path, 'wb') as f:
            f.write(b'x' * size)
        os.utime(path, (time.time() - age, time.time() - age))


def test_eviction_removes_whole_entries_failed_builds_first_then_least_recently_used(tmp_path):
    root = str(tmp_path)
    built = {'.so': 1000, '.sha256': 75, '.c': 500, '.lock': 0}
    keys = {name: name[0] * 32 for name in ('a', 'b', 'c', 'd', 'e', 'f')}
    make_entry(root, keys['a'], built, age=500)       # the oldest built entry
    make_entry(root, keys['b'], built, age=400)
    make_entry(root, keys['c'], built, age=100)
    make_entry(root, keys['d'], {'.c': 500, '.lock': 0}, age=10)   # a failed build: its source only
    make_entry(root, keys['e'], built, age=5000)      # older than all, but just built: kept
    (tmp_path / 'mnist').mkdir()
    (tmp_path / 'mnist' / 'train-images-idx3-ubyte.gz').write_bytes(b'x' * 10_000)
    assert [e.key for e in cache_entries(root)] == [keys[k] for k in 'deabc']
    assert [e.size for e in cache_entries(root)][:2] == [500, 1575]

    removed = evict(root, cap=3 * 1575, keep={keys['e']})
    assert removed == [keys['d'], keys['a']]          # the failed build's source, then the LRU
    left = sorted(os.listdir(root))
    assert not [n for n in left if n.startswith((keys['a'], keys['d']))]
    assert all(f'{keys[k]}{s}' in left for k in 'bce' for s in built)
    assert 'mnist' in left                            # not an entry: never touched
    assert evict(root, cap=0, keep={keys['e']}) == [keys['b'], keys['c']]
    assert [e.key for e in cache_entries(root)] == [keys['e']]


def test_an_entry_being_built_is_not_evicted(tmp_path):
    import fcntl
    root = str(tmp_path)
    make_entry(root, 'a' * 32, {'.so': 100, '.c': 100, '.lock': 0}, age=100)
    with open(tmp_path / ('a' * 32 + '.lock')) as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        assert evict(root, cap=0) == []
    assert evict(root, cap=0) == ['a' * 32]
    assert os.listdir(root) == []


@needs_cc
def test_builds_stay_under_the_cap_and_a_use_makes_an_entry_recent(fresh_cache, monkeypatch):
    tc = find_compiler(FAST_CC)
    flags = default_flags(tc)
    a, b = source_of(graph_a), source_of(graph_b)
    monkeypatch.setenv('MICROGRAD_CACHE_MAX', '1')     # room for nothing but the entry just built
    first = build_extension(a, tc, flags)
    assert [e.key for e in cache_entries(fresh_cache)] == [os.path.basename(first.path)[:-3]]
    second = build_extension(b, tc, flags)
    assert [e.key for e in cache_entries(fresh_cache)] == [os.path.basename(second.path)[:-3]]
    assert not build_extension(a, tc, flags).cached   # A was evicted: rebuilt

    monkeypatch.setenv('MICROGRAD_CACHE_MAX', '1G')
    build_extension(b, tc, flags)                     # both are now in the cache
    for path in (first.path, second.path):            # both last used an hour ago, B later than A
        old = time.time() - 3600 + (path == second.path)
        os.utime(path, (old, old))
    assert build_extension(a, tc, flags).cached       # using A makes it the most recent
    sizes = {e.key: e.size for e in cache_entries(fresh_cache)}
    assert evict(fresh_cache, cap=max(sizes.values())) == [os.path.basename(second.path)[:-3]]
    assert build_extension(a, tc, flags).cached


def cli(*args, env=None):
    """``python -m compiler ARGS`` in a child process: (exit status, stdout, stderr)."""
    env = {**os.environ, **(env or {}),
           'PYTHONPATH': os.pathsep.join(filter(None, [REPO, os.environ.get('PYTHONPATH')]))}
    r = subprocess.run([sys.executable, '-m', 'compiler', *args], capture_output=True, text=True,
                       env=env, timeout=120)
    return r.returncode, r.stdout, r.stderr


def main(capsys, *args):
    """``compiler.__main__.main(ARGS)`` here: (exit status, stdout, stderr)."""
    from compiler.__main__ import main as cli_main
    try:
        status = cli_main(list(args))
    except SystemExit as e:          # argparse refusing the arguments
        status = e.code
    out, err = capsys.readouterr()
    return status, out, err


@needs_cc
def test_the_cache_command_shows_and_clears_the_cache(fresh_cache, monkeypatch, capsys):
    tc = find_compiler(FAST_CC)
    toolchain._identify.__wrapped__(tc.path, tc.args)     # its identity kept here, which --clear removes too
    assert os.listdir(os.path.join(fresh_cache, cache.IDENTITIES))
    built = [build_extension(source_of(g), tc, default_flags(tc)) for g in (graph_a, graph_b)]
    with open(os.path.join(fresh_cache, 'c' * 32 + '.c'), 'w') as f:      # a failed build's source
        f.write('int broken(void) { return }\n')
    os.makedirs(os.path.join(fresh_cache, 'mnist'))
    with open(os.path.join(fresh_cache, 'mnist', 't10k-labels-idx1-ubyte.gz'), 'wb') as f:
        f.write(b'x' * 5000)
    total = sum(e.size for e in cache_entries(fresh_cache))

    status, out, err = cli('cache', '--info', env={'MICROGRAD_CACHE_DIR': fresh_cache,
                                                   'MICROGRAD_CACHE_MAX': '500M'})
    assert status == 0, err
    assert f'folder:  {fresh_cache} ($MICROGRAD_CACHE_DIR)' in out
    assert "entries: 3 (2 built, 1 failed builds' sources)" in out
    assert f'size:    {cache.format_size(total)}' in out
    assert 'cap:     500.0 MiB ($MICROGRAD_CACHE_MAX)' in out
    monkeypatch.delenv('MICROGRAD_CACHE_MAX', raising=False)
    status, out, _ = main(capsys, 'cache')               # --info is the default
    assert status == 0 and 'entries: 3' in out and 'cap:     1.0 GiB (default' in out

    status, out, err = main(capsys, 'cache', '--clear')
    assert status == 0, err
    assert f'removed 3 entries ({cache.format_size(total)})' in out
    assert sorted(os.listdir(fresh_cache)) == ['mnist']         # downloads are not builds
    assert not any(os.path.exists(b.path) for b in built)
    status, out, _ = main(capsys, 'cache', '--info')
    assert 'entries: 0 (0 built' in out and 'size:    0 B' in out


def test_the_cache_command_explains_its_mistakes(tmp_path, monkeypatch, capsys):
    status, _, err = main(capsys)
    assert status == 2 and 'COMMAND' in err
    status, _, err = main(capsys, 'cache', '--info', '--clear')
    assert status == 2 and 'not allowed with argument' in err
    monkeypatch.setenv('MICROGRAD_CACHE_DIR', str(tmp_path / 'none'))
    monkeypatch.setenv('MICROGRAD_CACHE_MAX', 'huge')
    status, out, err = main(capsys, 'cache', '--info')
    assert status == 1 and err.startswith('error: ') and 'MICROGRAD_CACHE_MAX' in err
    monkeypatch.delenv('MICROGRAD_CACHE_MAX')
    status, out, _ = main(capsys, 'cache', '--info')
    assert status == 0 and '(not created yet)' in out and 'entries: 0' in out
    status, out, _ = main(capsys, 'cache', '--clear')
    assert status == 0 and 'nothing to remove' in out
    assert not (tmp_path / 'none').exists()
    monkeypatch.setenv('MICROGRAD_CACHE', 'off')
    status, out, _ = main(capsys, 'cache', '--info')
    assert status == 0 and 'disabled by $MICROGRAD_CACHE' in out
