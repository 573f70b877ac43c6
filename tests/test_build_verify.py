"""A shared object is checked before it is recorded or used (issue 13, items 1 and 2).

A build whose compiler exits 0 but leaves a damaged object (tcc on a full
disk truncates it) is refused, never recorded, and rebuilt once the compiler
behaves; a cached object that is truncated is rebuilt whatever its checksum
file says; a cache entry replaced by another graph's object, checksum and
all, is caught by its ``program_hash`` when loaded, discarded and rebuilt.
The misbehaving compilers are real ones behind shell scripts. Damaged
objects are never loaded in the test process, only in the child that
``build`` uses to check them.
"""
import math
import os
import shutil
import struct

import pytest

import compiler
from compiler import build
from compiler.build import (BuildError, CompileError, build_extension, default_flags, elf_problem,
                            build_key, find_compiler, program_hash)
from compiler.files import sha256_file
from compiler.load import load_module
from micrograd import Value

from tests.differential import COMPILERS, FAST_CC, needs_cc
from tests.test_build import (assert_explains, assert_nothing_half_written, fresh_cache,  # noqa: F401
                              wrapper_cc)


def graph_a():
    x, w = Value(0.0), Value(2.0)
    return (x * w + 1.0).tanh(), [x], [w]


def graph_b():
    """Another program with the same inputs and parameters as ``graph_a``."""
    x, w = Value(0.0), Value(2.0)
    return (x * w - 3.0).exp(), [x], [w]


def source_of(graph):
    """The C source ``compiler.compile`` builds for ``graph`` (got from a build
    without the cache, so that no cache entry is loaded here)."""
    old = os.environ.get('MICROGRAD_CACHE')
    os.environ['MICROGRAD_CACHE'] = '0'
    try:
        return compiler.compile(*graph(), cc=FAST_CC).source
    finally:
        if old is None:
            del os.environ['MICROGRAD_CACHE']
        else:
            os.environ['MICROGRAD_CACHE'] = old


def forward(model, x=0.5):
    model.set_input([x])
    return model.forward()


# -- item 1: a damaged build is never recorded ------------------------------------------------

@needs_cc
@pytest.mark.parametrize('cc', COMPILERS)
def test_a_compiler_that_truncates_its_output_and_exits_0_records_nothing(cc, tmp_path, fresh_cache):
    """Like tcc on a full disk: exit status 0, half a shared object. It is
    refused (and the test never loads it); when the compiler behaves again
    the same graph builds, is recorded and loads."""
    full = tmp_path / 'disk-is-full'
    full.touch()
    wcc = wrapper_cc(str(tmp_path), f'truncating-{cc}', shutil.which(cc), '',
                     after=f'if [ -e {full} ]; then size=$(wc -c < "$out"); '
                           'truncate -s $((size / 2)) "$out"; fi')
    tc = find_compiler(wcc)
    source = source_of(graph_a)
    with pytest.raises(CompileError) as e:
        build_extension(source, tc, default_flags(tc))
    assert_explains(e.value, 'exited 0', 'cannot be used', 'truncated', 'C source kept at')
    assert 'please report' not in str(e.value)
    assert_nothing_half_written(fresh_cache)

    full.unlink()                                   # space is back
    again = build_extension(source, tc, default_flags(tc))
    assert again.cmd is not None and not again.cached
    assert elf_problem(again.path) is None
    assert build_extension(source, tc, default_flags(tc)).cached
    m = load_module(again.path)
    assert m.program_hash == program_hash(source)


@needs_cc
def test_a_truncated_cached_object_is_rebuilt_whatever_its_checksum_file_says(fresh_cache):
    """The checksum file is rewritten to match the truncated object (as the
    old code recorded one after tcc truncated it): it is rebuilt anyway."""
    tc = find_compiler(FAST_CC)
    source, flags = source_of(graph_a), default_flags(tc)
    first = build_extension(source, tc, flags)
    so, digest = first.path, first.path[:-len('.so')] + '.sha256'
    good_sha = sha256_file(so)
    with open(so, 'r+b') as f:
        f.truncate(os.path.getsize(so) // 2)
    with open(digest) as f:
        recorded = f.read()
    with open(digest, 'w') as f:
        f.write(recorded.replace(good_sha, sha256_file(so)))
    again = build_extension(source, tc, flags)
    assert again.cmd is not None and not again.cached, "a truncated object was served from the cache"
    assert elf_problem(so) is None and sha256_file(so) == good_sha
    assert forward(compiler.compile(*graph_a(), cc=FAST_CC)) == math.tanh(0.5 * 2.0 + 1.0)


CRASH_ON_LOAD = '__attribute__((constructor)) static void crash(void) { *(volatile int *)0 = 1; }\n'


@needs_cc
def test_an_object_that_crashes_when_loaded_crashes_only_the_checking_child(tmp_path, fresh_cache):
    """A whole, well-formed ELF shared object whose constructor dereferences
    NULL: loading it here would kill the test process."""
    boom = tmp_path / 'boom.c'
    boom.write_text(CRASH_ON_LOAD)
    real = shutil.which(FAST_CC)
    wcc = str(tmp_path / 'crashcc')
    with open(wcc, 'w') as f:
        f.write(f'#!/bin/sh\ncase "$1" in -E|--version|-v) exec {real} "$@";; esac\n'
                f'exec {real} "$@" {boom}\n')
    os.chmod(wcc, 0o755)
    tc = find_compiler(wcc)
    with pytest.raises(CompileError) as e:
        build_extension(source_of(graph_a), tc, default_flags(tc))
    assert_explains(e.value, 'exited 0', 'loading it crashed a test process (SIGSEGV)')
    assert_nothing_half_written(fresh_cache)


@needs_cc
def test_the_elf_checks_name_what_is_wrong(tmp_path, fresh_cache):
    tc = find_compiler(FAST_CC)
    good = open(build_extension(source_of(graph_a), tc, default_flags(tc)).path, 'rb').read()
    assert good[:4] == b'\x7fELF'

    def problem(data):
        path = tmp_path / 'x.so'
        path.write_bytes(data)
        return elf_problem(str(path))

    assert problem(good) is None
    assert problem(b'') == 'it is empty'
    assert problem(b'#!/bin/sh\necho not a library\n') == 'it is not an ELF file'
    assert 'truncated' in problem(good[:10])
    assert 'truncated' in problem(good[:40])
    assert 'truncated' in problem(good[:len(good) // 2])
    assert 'truncated' in problem(good[:-1])              # the section headers come last
    other_class = good[:4] + bytes([3 - good[4]]) + good[5:]
    assert 'another class' in problem(other_class)
    endian = '<' if good[5] == 1 else '>'
    other_machine = good[:18] + struct.pack(endian + 'H', 183 if good[18] != 183 else 62) + good[20:]
    assert 'another machine' in problem(other_machine)    # aarch64 for x86-64 and back
    executable = good[:16] + struct.pack(endian + 'H', 2) + good[18:]
    assert 'not a shared object' in problem(executable)


# -- item 2: the loaded module must be the program compiled -----------------------------------

@needs_cc
def test_a_cache_entry_replaced_by_another_graphs_object_and_checksum_is_rebuilt(fresh_cache):
    tc = find_compiler(FAST_CC)
    flags = default_flags(tc)
    a, b = source_of(graph_a), source_of(graph_b)
    assert program_hash(a) != program_hash(b)
    built_a, built_b = build_extension(a, tc, flags), build_extension(b, tc, flags)
    sidecar = lambda path: path[:-len('.so')] + '.sha256'      # noqa: E731
    shutil.copyfile(built_b.path, built_a.path)                # B's object and checksum under A's key
    shutil.copyfile(sidecar(built_b.path), sidecar(built_a.path))
    assert build_extension(a, tc, flags).cached                # the checksum agrees: only loading tells

    m = compiler.compile(*graph_a(), cc=FAST_CC)
    assert m.module.program_hash == program_hash(a)
    assert m.build.cmd is not None and not m.build.cached, "the foreign entry was not rebuilt"
    assert forward(m) == math.tanh(0.5 * 2.0 + 1.0)    # tanh(0.5 * 2 + 1)
    assert sha256_file(built_a.path) != sha256_file(built_b.path)
    again = compiler.compile(*graph_a(), cc=FAST_CC)           # and the repaired entry serves
    assert again.build.cached and again.module.program_hash == program_hash(a)


@needs_cc
def test_a_compiler_that_keeps_producing_another_graphs_object_is_a_clear_error(tmp_path, fresh_cache):
    tc = find_compiler(FAST_CC)
    other = build_extension(source_of(graph_b), tc, default_flags(tc)).path
    saved = tmp_path / 'b.so'
    shutil.copyfile(other, saved)
    real = shutil.which(FAST_CC)
    wcc = wrapper_cc(str(tmp_path), 'foreigncc', real, '', after=f'cp {saved} "$out"')
    with pytest.raises(BuildError) as e:
        compiler.compile(*graph_a(), cc=wcc)
    assert_explains(e.value, 'program_hash', program_hash(source_of(graph_b)),
                    program_hash(source_of(graph_a)), 'another program')
    assert_nothing_half_written_for(fresh_cache, build_key(
        source_of(graph_a), find_compiler(wcc), default_flags(find_compiler(wcc))))


def assert_nothing_half_written_for(folder, key):
    left = [f for f in os.listdir(folder) if key in f and not f.endswith(('.c', '.lock'))]
    assert not left, f"left in the cache: {left}"
