"""``-march=native`` builds are keyed on what it resolves to (issue 13, item 3).

A cache shared between machines (an NFS home) must not serve one CPU's
``-march=native`` code to another: the key holds the compiler's own
expansion of ``-march=native`` on this machine. The probe runs once per
process and compiler, and only for flags that ask for ``native``.
"""
import shutil

import pytest

from compiler.build import cache, toolchain
from compiler.build import Toolchain, build_key, default_flags, find_compiler

from tests.differential import needs_cc
from tests.test_build import compile_tiny, fresh_cache  # noqa: F401

GCC = Toolchain('/usr/bin/gcc', 'gcc', 'gcc (Debian 12.2.0-14) 12.2.0')
SOURCE = 'int x;\n'


def test_the_key_of_a_native_build_changes_with_the_resolved_target(monkeypatch):
    flags = default_flags(GCC, native=True)
    assert '-march=native' in flags
    monkeypatch.setattr(cache, 'native_target', lambda tc: 'gcc: -march= znver4 -mavx512f [enabled]')
    here = build_key(SOURCE, GCC, flags)
    monkeypatch.setattr(cache, 'native_target', lambda tc: 'gcc: -march= haswell -mavx512f [disabled]')
    elsewhere = build_key(SOURCE, GCC, flags)
    assert here != elsewhere, "two CPUs share the cache entry of a -march=native build"
    for flag in ('-mcpu=native', '-mtune=native'):
        monkeypatch.setattr(cache, 'native_target', lambda tc: 'one CPU')
        one = build_key(SOURCE, GCC, ['-O2', flag])
        monkeypatch.setattr(cache, 'native_target', lambda tc: 'another CPU')
        assert build_key(SOURCE, GCC, ['-O2', flag]) != one, flag


def test_plain_flags_do_not_pay_for_the_probe(monkeypatch):
    def probe(tc):
        raise AssertionError("the -march=native probe ran for flags without native")
    monkeypatch.setattr(cache, 'native_target', probe)
    for flags in (default_flags(GCC), ['-O2', '-march=x86-64-v3', '-shared', '-fPIC'], []):
        build_key(SOURCE, GCC, flags)


@needs_cc
def test_a_build_without_native_runs_no_probe(monkeypatch, fresh_cache):
    def probe(tc):
        raise AssertionError("the -march=native probe ran for a build without native")
    monkeypatch.setattr(cache, 'native_target', probe)
    compile_tiny()


@pytest.mark.parametrize('cc', [c for c in ('clang', 'gcc') if shutil.which(c)])
def test_the_probe_reads_the_compilers_own_expansion_once(cc):
    tc = find_compiler(cc)
    toolchain.native_target.cache_clear()
    target = toolchain.native_target(tc)
    assert target.startswith(f'{cc}: ')
    assert ('target-cpu=' if cc == 'clang' else '-march=') in target
    assert 'native' not in target.split(' ', 2)[1]        # resolved, not repeated
    assert toolchain.native_target(tc) == target
    info = toolchain.native_target.cache_info()
    assert (info.misses, info.hits) == (1, 1)


@pytest.mark.parametrize('cc', [c for c in ('clang', 'gcc') if shutil.which(c)])
def test_native_and_plain_builds_are_different_entries(cc, fresh_cache):
    plain = compile_tiny(cc=cc)
    native = compile_tiny(cc=cc, native=True)
    assert '-march=native' in native.build.flags and not native.build.cached
    assert native.build.path != plain.build.path
    assert compile_tiny(cc=cc, native=True).build.cached


def test_without_a_compiler_expansion_the_cpu_flags_decide(monkeypatch):
    tcc_like = Toolchain('/usr/bin/tcc', 'tcc', 'tcc version 0.9.27')
    toolchain.native_target.cache_clear()
    try:
        target = toolchain.native_target(tcc_like)
    finally:
        toolchain.native_target.cache_clear()
    assert target.startswith(('cpuinfo: ', 'platform: '))
    if target.startswith('cpuinfo: '):
        assert 'flags=' in target or 'Features=' in target or 'isa=' in target
