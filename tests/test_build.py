"""Building: compiler problems, the build cache, other Python versions.

Failures are provoked with real failing programs: shell scripts standing in
for a C compiler that hang, fail, or write half a file; a PATH with no
compiler; an include folder without ``Python.h``.
"""
import glob
import json
import math
import os
import shutil
import subprocess
import sys
import sysconfig
import textwrap
import threading
import time

import numpy as np
import pytest

import compiler
from compiler import build, cpu
from compiler.build import (BuildError, CacheError, CompileError, CompilerNotFound, CompileTimeout,
                            HeadersNotFound, Toolchain, build_extension, build_key, cache_dir,
                            default_flags, find_compiler)
from compiler.build import run as build_run
from compiler.codegen import Source, kernels_unit
from compiler.constants import KERNELS
from compiler.load import load_module
from micrograd import Value
from micrograd.nn import MLP

from tests.differential import COMPILERS, FAST_CC, needs_cc
from tests.graphs import small_graph

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# What gcc prints when it identifies itself (preprocessing build.IDENTIFY_PROBE)
# and when asked its version.
GCC_IDENTITY = ('case "$1" in\n'
                '  -E) echo "micrograd_compiler_is_gcc 12 2 0"; exit 0;;\n'
                '  --version) echo "gcc (Fake) 12.2.0"; '
                'echo "Copyright (C) 2022 Free Software Foundation, Inc."; exit 0;;\n'
                'esac')


def fake_cc(folder, name, body):
    """A shell script that passes for gcc when identified and runs ``body`` otherwise."""
    path = os.path.join(folder, name)
    with open(path, 'w') as f:
        f.write(f'#!/bin/sh\n{GCC_IDENTITY}\n{body}\n')
    os.chmod(path, 0o755)
    return path


def wrapper_cc(folder, name, real, body, after=''):
    """A real compiler behind a shell script: identification goes to ``real``;
    a build runs ``body`` (with ``$out``, the ``-o`` file, set), then ``real``
    itself, then ``after``."""
    path = os.path.join(folder, name)
    with open(path, 'w') as f:
        f.write(f'#!/bin/sh\ncase "$1" in -E|--version|-v) exec {real} "$@";; esac\n'
                'out=; prev=; for a in "$@"; do [ "$prev" = -o ] && out=$a; prev=$a; done\n'
                f'{body}\n{real} "$@" || exit $?\n{after}\n')
    os.chmod(path, 0o755)
    return path


@pytest.fixture
def fresh_cache(tmp_path, monkeypatch):
    folder = str(tmp_path / 'cache')
    monkeypatch.setenv('MICROGRAD_CACHE_DIR', folder)
    monkeypatch.delenv('MICROGRAD_CACHE', raising=False)
    return folder


def tiny():
    x, w = Value(0.0), Value(2.0)
    return (x * w + 1.0).tanh(), [x], [w]


def compile_tiny(**kwargs):
    loss, inputs, params = tiny()
    return compiler.compile(loss, inputs, params, **kwargs)


def assert_nothing_half_written(folder):
    """No shared object, checksum or temporary file: only kept sources, locks,
    and the whole objects of translation units that did compile (with their
    checksums: each is an entry of its own, reused by the next build)."""
    left = os.listdir(folder) if os.path.isdir(folder) else []
    objects = {f[:-2] for f in left if f.endswith('.o')}
    bad = [f for f in left if f.endswith('.so') or f.startswith('.tmp-')
           or f.endswith('.sha256') and f[:-7] not in objects]
    assert not bad, f"left in the cache: {bad}"


def assert_explains(e, *words):
    text = str(e)
    for word in words:
        assert word in text, f"{word!r} not in:\n{text}"


# -- compiler problems ---------------------------------------------------------------

def test_the_build_errors_are_one_family():
    for cls in (CompilerNotFound, HeadersNotFound, CompileError, CompileTimeout, CacheError):
        assert issubclass(cls, BuildError) and cls is getattr(compiler, cls.__name__, None), cls


def test_a_hanging_compiler_is_killed_with_its_children(tmp_path, fresh_cache):
    """The fake compiler's ``sleep`` child holds the output pipes: unless the
    whole process group is killed, waiting for the pipes would take 60 s."""
    pidfile = tmp_path / 'sleep.pid'
    cc = fake_cc(str(tmp_path), 'hangcc', f'sleep 60 & echo $! > {pidfile}\nwait')
    t0 = time.monotonic()
    with pytest.raises(CompileTimeout) as e:
        compile_tiny(cc=cc, timeout=1)
    elapsed = time.monotonic() - t0
    assert elapsed < 20, f"the timeout took {elapsed:.0f} s"
    assert e.value.cmd[0] == cc and os.path.exists(e.value.source_path)
    assert 'PyInit_nn' in open(e.value.source_path).read()
    assert_explains(e.value, 'did not finish within 1 s', 'try tcc', 'command: ' + cc,
                    'C source kept at: ' + e.value.source_path)
    pid = int(pidfile.read_text())
    for _ in range(100):               # the orphaned sleep is reaped by init shortly
        if not _alive(pid):
            break
        time.sleep(0.05)
    assert not _alive(pid), "the compiler's child is still running"
    assert_nothing_half_written(fresh_cache)


def _alive(pid):
    try:
        with open(f'/proc/{pid}/stat') as f:
            return f.read().split(') ')[1][0] != 'Z'     # a zombie is dead
    except FileNotFoundError:
        return False


def test_a_failing_compiler_is_a_compile_error_with_its_stderr(tmp_path, fresh_cache):
    cc = fake_cc(str(tmp_path), 'badcc', textwrap.dedent('''\
        echo "nn.c:12:5: error: expected ';' before '}' token" >&2
        echo "   12 |     x = 1" >&2
        exit 1'''))
    with pytest.raises(CompileError) as e:
        compile_tiny(cc=cc)
    assert e.value.returncode == 1 and e.value.cmd[0] == cc
    assert "error: expected ';'" in e.value.stderr
    assert_explains(e.value, 'failed to compile', 'exit status: 1', "error: expected ';'",
                    '12 |     x = 1', 'C source kept at: ' + e.value.source_path)
    assert os.path.dirname(e.value.source_path) == fresh_cache
    assert_nothing_half_written(fresh_cache)


def test_a_compiler_that_dies_half_way_leaves_nothing(tmp_path, fresh_cache):
    cc = fake_cc(str(tmp_path), 'oomcc', textwrap.dedent('''\
        while [ $# -gt 0 ]; do if [ "$1" = -o ]; then out=$2; fi; shift; done
        printf '\\177ELF half a shared object' > "$out"
        echo "cc1: out of memory allocating 4096 bytes" >&2
        exit 137'''))
    with pytest.raises(CompileError) as e:
        compile_tiny(cc=cc)
    assert e.value.returncode == 137
    assert_nothing_half_written(fresh_cache)
    with pytest.raises(CompileError):         # and it is not found in the cache next time
        compile_tiny(cc=cc)


def test_a_compiler_that_succeeds_without_output_is_a_compile_error(tmp_path, fresh_cache):
    cc = fake_cc(str(tmp_path), 'lazycc', 'exit 0')
    with pytest.raises(CompileError) as e:
        compile_tiny(cc=cc)
    assert_explains(e.value, 'exited 0 but wrote no shared object')
    assert_nothing_half_written(fresh_cache)


@needs_cc
@pytest.mark.parametrize('cc', COMPILERS)
def test_a_real_compile_error_is_reported_with_the_compilers_words(cc, fresh_cache):
    tc = find_compiler(cc)
    with pytest.raises(CompileError) as e:
        build_extension('int broken(void) { return }\n', tc, default_flags(tc))
    assert e.value.returncode not in (0, None) and e.value.stderr.strip()
    assert e.value.cmd[0] == tc.path and open(e.value.source_path).read().startswith('int broken')
    assert_explains(e.value, 'command: ' + tc.path, 'exit status', 'C source kept at')
    assert_nothing_half_written(fresh_cache)


@needs_cc
def test_missing_python_headers_say_what_to_install(tmp_path, fresh_cache, monkeypatch):
    for include in (tmp_path / 'nonexistent', tmp_path):       # absent; present but empty
        monkeypatch.setenv('MICROGRAD_PYTHON_INCLUDE', str(include))
        with pytest.raises(HeadersNotFound) as e:
            compile_tiny(cc=FAST_CC)
        assert_explains(e.value, f'Python.h is not in {include}', 'python3-dev', 'C source kept at')
        assert_nothing_half_written(fresh_cache)


@needs_cc
@pytest.mark.parametrize('cc', COMPILERS)
def test_broken_python_headers_are_recognised_in_the_compilers_stderr(cc, tmp_path, fresh_cache):
    """A Python.h whose own includes are missing: the real compiler fails,
    and its message is recognised as a headers problem."""
    include = tmp_path / 'include'
    include.mkdir()
    (include / 'Python.h').write_text('#include "pyconfig-that-is-missing.h"\n')
    tc = find_compiler(cc)
    with pytest.raises(HeadersNotFound) as e:
        build_extension(compiler.emit_module(compiler.trace(tiny()[0], *tiny()[1:])), tc,
                        default_flags(tc), include_dir=str(include))
    assert e.value.returncode not in (0, None)
    assert_explains(e.value, 'could not find the Python headers', 'python3-dev',
                    'pyconfig-that-is-missing.h', 'command: ')
    assert_nothing_half_written(fresh_cache)


def test_a_compiler_saying_python_h_is_missing_is_a_headers_error(tmp_path, fresh_cache):
    cc = fake_cc(str(tmp_path), 'noheaderscc', textwrap.dedent('''\
        echo "nn.c:12:10: fatal error: Python.h: No such file or directory" >&2
        exit 1'''))
    with pytest.raises(HeadersNotFound) as e:
        compile_tiny(cc=cc)
    assert e.value.returncode == 1 and e.value.cmd[0] == cc
    assert_nothing_half_written(fresh_cache)


def test_no_compiler_on_the_path(tmp_path, monkeypatch):
    empty = tmp_path / 'bin'
    empty.mkdir()
    monkeypatch.setenv('PATH', str(empty))
    monkeypatch.delenv('CC', raising=False)
    with pytest.raises(CompilerNotFound) as e:
        find_compiler()
    assert_explains(e.value, 'no C compiler found', 'clang, gcc, tcc, cc', 'apt-get install')
    with pytest.raises(CompilerNotFound):
        compile_tiny()
    monkeypatch.setenv('CC', 'no-such-cc')
    with pytest.raises(CompilerNotFound, match='tried no-such-cc'):
        compile_tiny()
    with pytest.raises(CompilerNotFound, match='tried /nonexistent/gcc'):
        compile_tiny(cc='/nonexistent/gcc')


def test_a_program_that_is_not_a_c_compiler(tmp_path):
    path = tmp_path / 'notcc'
    path.write_text('#!/bin/sh\necho "hello from a script"\n')
    path.chmod(0o755)
    with pytest.raises(CompilerNotFound) as e:
        compile_tiny(cc=str(path))
    assert_explains(e.value, 'does not identify itself as clang, gcc or tcc', 'apt-get install')


def test_without_a_cache_a_failed_build_keeps_only_the_source(tmp_path, monkeypatch):
    monkeypatch.setenv('MICROGRAD_CACHE', '0')
    cc = fake_cc(str(tmp_path), 'badcc', 'echo "nn.c:1: error: nope" >&2; exit 1')
    with pytest.raises(CompileError) as e:
        compile_tiny(cc=cc)
    folder = os.path.dirname(e.value.source_path)
    try:
        assert os.listdir(folder) == ['nn.c']
    finally:
        shutil.rmtree(folder)


# -- the build cache -------------------------------------------------------------------

def test_the_default_cache_folder_is_private(tmp_path, monkeypatch):
    monkeypatch.delenv('MICROGRAD_CACHE_DIR')
    monkeypatch.setenv('XDG_CACHE_HOME', str(tmp_path / 'xdg'))
    old = os.umask(0)                  # the mode must not depend on the umask
    try:
        folder = cache_dir()
    finally:
        os.umask(old)
    assert folder == str(tmp_path / 'xdg' / 'micrograd-compiler')
    assert os.stat(folder).st_mode & 0o777 == 0o700
    os.chmod(folder, 0o755)            # made wider by someone: narrowed again
    assert cache_dir() == folder and os.stat(folder).st_mode & 0o777 == 0o700
    explicit = tmp_path / 'explicit' / 'cache'
    monkeypatch.setenv('MICROGRAD_CACHE_DIR', str(explicit))
    old = os.umask(0)
    try:
        assert cache_dir() == str(explicit)      # a $MICROGRAD_CACHE_DIR it creates is private too
    finally:
        os.umask(old)
    assert explicit.stat().st_mode & 0o777 == 0o700


def test_a_cache_folder_others_can_write_is_refused(tmp_path, monkeypatch):
    folder = tmp_path / 'shared-cache'
    folder.mkdir()
    monkeypatch.setenv('MICROGRAD_CACHE_DIR', str(folder))
    folder.chmod(0o777)
    with pytest.raises(BuildError, match='writable by others'):
        cache_dir()
    folder.chmod(0o775)
    with pytest.raises(BuildError, match='chmod go-w'):
        cache_dir()
    folder.chmod(0o755)                # the user's own choice: readable is left as it is
    assert cache_dir() == str(folder) and folder.stat().st_mode & 0o777 == 0o755


@pytest.mark.skipif(os.getuid() != 0, reason="needs root to give a folder to another user")
def test_a_cache_folder_of_another_user_is_refused(tmp_path, monkeypatch):
    folder = tmp_path / 'theirs'
    folder.mkdir(mode=0o700)
    os.chown(folder, 4242, 4242)
    monkeypatch.setenv('MICROGRAD_CACHE_DIR', str(folder))
    with pytest.raises(BuildError, match='belongs to uid 4242'):
        cache_dir()


def test_the_build_key_changes_with_everything_that_decides_the_binary(monkeypatch):
    tc = Toolchain('/usr/bin/gcc', 'gcc', 'gcc (Debian 12.2.0-14) 12.2.0')
    source, flags = 'int x;\n', ['-O2', '-shared', '-fPIC']
    base = build_key(source, tc, flags)
    assert build_key(source, tc, list(flags)) == base
    variants = {
        'source': build_key(source + ' ', tc, flags),
        'compiler path': build_key(source, Toolchain('/usr/local/bin/gcc', 'gcc', tc.version), flags),
        'compiler version': build_key(source, Toolchain(tc.path, 'gcc', 'gcc 13.1.0'), flags),
        'a flag': build_key(source, tc, ['-O3', '-shared', '-fPIC']),
        'flag order': build_key(source, tc, ['-shared', '-O2', '-fPIC']),
        'flags split differently': build_key(source, tc, ['-O2 -shared', '-fPIC']),
        'include folder': build_key(source, tc, flags, include_dir='/opt/python3.13/include'),
    }
    real = sysconfig.get_config_var
    monkeypatch.setattr(build.cache.sysconfig, 'get_config_var',
                        lambda name: '.cpython-313-x86_64-linux-gnu.so' if name == 'EXT_SUFFIX' else real(name))
    variants['extension suffix'] = build_key(source, tc, flags)
    keys = list(variants.values())
    assert base not in keys and len(set(keys)) == len(keys), variants


def test_the_generator_version_is_part_of_the_source_and_so_of_the_key():
    from compiler.codegen import GENERATOR_VERSION
    loss, inputs, params = tiny()
    source = compiler.emit_module(compiler.trace(loss, inputs, params))
    assert f'micrograd-compiler {GENERATOR_VERSION}:' in source


@needs_cc
def test_a_truncated_or_corrupt_cached_object_is_rebuilt(fresh_cache):
    """The objects are built with ``build_extension`` and not loaded until the
    end: changing a file that is mapped into this process would crash it."""
    loss, inputs, params = tiny()
    source = compiler.emit_module(compiler.trace(loss, inputs, params))
    tc = find_compiler(FAST_CC)
    flags = default_flags(tc)
    first = build_extension(source, tc, flags)
    assert first.cmd is not None and not first.cached
    assert build_extension(source, tc, flags).cached
    so, digest = first.path, first.path[:-len('.so')] + '.sha256'
    good = open(so, 'rb').read()

    def damage_truncate():
        with open(so, 'r+b') as f:
            f.truncate(len(good) // 2)

    def damage_flip():
        with open(so, 'r+b') as f:
            f.seek(len(good) // 2)
            f.write(bytes([good[len(good) // 2] ^ 0xFF]))

    def damage_sidecar():
        os.remove(digest)

    def damage_sidecar_garbage():
        with open(digest, 'w') as f:
            f.write('0' * 64)

    def damage_empty():
        open(so, 'wb').close()

    for damage in (damage_truncate, damage_flip, damage_sidecar, damage_sidecar_garbage, damage_empty):
        damage()
        again = build_extension(source, tc, flags)
        assert again.cmd is not None and not again.cached, damage.__name__
        assert build_extension(source, tc, flags).cached
    m = load_module(so)
    m.write_params(np.array([2.0]))
    m.set_input([0.5])
    assert m.forward() == math.tanh(0.5 * 2.0 + 1.0)


BUILDER = textwrap.dedent('''\
    import json, os, sys, time
    import compiler
    from tests.graphs import small_graph
    n, folder, cc = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    open(os.path.join(folder, f'ready-{{n}}'), 'w').close()
    while not os.path.exists(os.path.join(folder, 'go')):
        time.sleep(0.005)
    loss, inputs, params, outputs = small_graph()
    m = compiler.compile(loss, inputs, params, outputs, cc=cc)
    m.set_input([0.5, -0.5, 1.0])
    print(json.dumps({{'built': m.build.cmd is not None, 'cached': m.build.cached,
                      'path': m.build.path, 'loss': m.forward().hex()}}))
''')


def compiler_runs(monkeypatch):
    """Every compiler run from here on, as (thread name, output file name)."""
    runs, real = [], build_run.run_in_own_group

    def run(cmd, **kwargs):
        runs.append((threading.current_thread().name, os.path.basename(cmd[cmd.index('-o') + 1])))
        return real(cmd, **kwargs)
    monkeypatch.setattr(build_run, 'run_in_own_group', run)
    return runs


@needs_cc
def test_the_loop_kernels_are_built_ahead_while_a_large_graph_passes(fresh_cache, monkeypatch):
    """compile() of a graph of AHEAD_MIN_OPS ops or more starts the loop
    kernels' unit (the same for every program) on a second core after the
    trace; the build then finds that object in the cache instead of compiling
    it again, and the results are the interpreter's."""
    monkeypatch.setattr(compiler, 'usable_cores', lambda: 2)
    runs = compiler_runs(monkeypatch)
    model = MLP(200, [56, 10], seed=0)
    x = [Value(math.sin(i)) for i in range(200)]
    out = model(x)
    zero = Value(0.0)
    loss = sum((o * o for o in out), zero)
    m = compiler.compile(loss, x, model.parameters(), cc=FAST_CC, constants=[zero])
    assert m.program.n_ops > 0 and sum(isinstance(op, compiler.MatVec) for op in m.program.ops)
    name, text = kernels_unit()
    tc, flags = m.build.toolchain, m.build.flags
    kernels = build.build_key(text, tc, ['-c', *flags]) + '.o'
    assert os.path.exists(os.path.join(fresh_cache, kernels))
    built = [thread for thread, out in runs if out.startswith(f'.tmp-{kernels[:-2]}')]
    assert built == ['micrograd-kernels-ahead'], runs
    loss.backward()
    m.set_input([v.data for v in x])
    assert m.forward() == loss.data
    m.backward()
    assert list(m.grads()) == [p.grad for p in model.parameters()]


AT_ONCE_RUN = textwrap.dedent("""
    import sys
    sys.path[:0] = [{root!r}]
    import compiler
    from compiler.build import BuildRequest, default_flags, find_compiler
    from compiler.templates import read_template
    from micrograd import Value
    from micrograd.nn import MLP
    model = MLP(200, [32, 10], seed=0)    # 6,762 parameters: the trace needs the C walk
    x = [Value(0.5) for _ in range(200)]
    compiler.compile(sum(model(x)), x, model.parameters())
    tc = find_compiler(None)
    print(BuildRequest.of(read_template('walk.c'), tc, default_flags(tc)).key())
""")


@needs_cc
def test_the_c_walk_built_while_the_kernels_are_built_ahead_is_found_in_the_cache(tmp_path):
    """On a cold cache the trace starts the loop kernels' build before it
    builds the C walk: two builds in two threads of a fresh process, whose
    first use of sysconfig once left the walk a key without the extension
    suffix (a cache entry no later process finds)."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, MICROGRAD_CACHE_DIR=str(tmp_path / 'cache'))
    for name in ('MICROGRAD_CACHE', 'MICROGRAD_NATIVE_WALK'):
        env.pop(name, None)
    done = subprocess.run([sys.executable, '-c', AT_ONCE_RUN.format(root=root)],
                          capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    key = done.stdout.split()[-1]
    assert os.path.exists(tmp_path / 'cache' / f'{key}.so'), sorted(os.listdir(tmp_path / 'cache'))


@needs_cc
def test_a_small_graph_builds_nothing_ahead_and_nothing_is_built_ahead_without_a_cache(fresh_cache,
                                                                                       monkeypatch):
    runs = compiler_runs(monkeypatch)
    model = MLP(20, [16, 4], seed=0)          # MatVecs, but 1,000 ops: the front end is quick
    x = [Value(0.5) for _ in range(20)]
    compiler.compile(sum(model(x)), x, model.parameters(), cc=FAST_CC)
    assert runs and not [thread for thread, _ in runs if thread.endswith('-ahead')], runs
    monkeypatch.setenv('MICROGRAD_CACHE', '0')
    name, text = kernels_unit()
    request = build.plan(Source('', [('module', ''), (name, text)]), cc=FAST_CC)
    assert build.build_unit_ahead(request, name, text) is None


def test_a_machine_builds_the_widest_vector_set_its_cpu_has_or_the_baseline():
    avx512 = frozenset({'avx512f', 'avx512vl', 'avx512bw', 'avx512dq', 'avx2', 'sse2'})
    assert cpu.sets_for(avx512) == ('avx512',)
    assert cpu.sets_for(avx512 - {'avx512dq'}) == ('avx2',)     # all four, as vector_level() asks
    assert cpu.sets_for(frozenset({'sse2'})) == ()
    assert cpu.sets_for(avx512, 'avx2') == ('avx2',)            # $MICROGRAD_KERNELS caps it
    assert cpu.sets_for(avx512, 'base') == ()
    assert cpu.sets_for(frozenset({'avx2'}), 'avx512') == ('avx2',)
    assert cpu.kernel_sets('no such set') == cpu.ALL_SETS       # loading refuses it, with its message
    assert cpu.kernel_sets('base') == ('base',)
    assert len(cpu.kernel_sets('')) == 1 or cpu.cpu_flags() is None
    for sets in [('base',), ('avx2',), ('avx512', 'base'), cpu.ALL_SETS]:
        text = kernels_unit(sets)[1]
        assert [s for s in cpu.VECTOR_SETS if f'#define MV_HAS_{s.upper()} 1' in text] == \
            [s for s in sets if s != 'base']
        # the baseline: built where asked, and where the vector sets are not (not x86-64)
        assert text.count('#define MV_ISA base') == 1
        assert ('#else\n#define MV_ISA base' in text) == ('base' not in sets)


@pytest.mark.skipif(not [cc for cc in COMPILERS if cc != 'tcc'], reason='needs gcc or clang: tcc builds '
                    'only the plain loops')
@pytest.mark.skipif(cpu.kernel_sets('') == ('base',), reason='this CPU has no vector set beyond the baseline')
def test_a_module_built_without_the_baseline_refuses_to_load_where_narrower_loops_are_asked_for(tmp_path):
    """A module built for this machine carries its CPU's widest vector set
    alone. Loaded in a process that asks for narrower loops, it says so and
    what to do (it has no loops to run there); where its set is allowed it
    loads and runs."""
    cc = next(cc for cc in COMPILERS if cc != 'tcc')
    model = MLP(20, [16, 4], seed=0)
    x = [Value(0.25 * i) for i in range(20)]
    loss = sum(model(x))
    m = compiler.compile(loss, x, model.parameters(), cc=cc)
    assert m.module.kernels == cpu.kernel_sets('')[0]
    script = (f'from compiler.load import load_module\nm = load_module({str(m.build.path)!r})\n'
              f'm.set_input([0.25 * i for i in range(20)])\nprint(m.kernels, m.forward())\n')
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    narrower = KERNELS[:KERNELS.index(m.module.kernels)]
    for want in ('', m.module.kernels, *narrower):
        env = dict(os.environ, PYTHONPATH=root, MICROGRAD_KERNELS=want)
        done = subprocess.run([sys.executable, '-c', script], capture_output=True, text=True, env=env,
                              timeout=120)
        if want in narrower:
            assert done.returncode != 0
            assert done.stderr.strip().splitlines()[-1] == (
                "ValueError: this module's loops were built for wider instruction sets than this CPU or "
                "$MICROGRAD_KERNELS allows: compile the model again where and as it runs (compiler.compile() "
                "builds the loops it picks)")
        else:
            assert done.returncode == 0, done.stderr
            isa, loss_there = done.stdout.split()
            assert isa == m.module.kernels and math.isfinite(float(loss_there))


@pytest.mark.skipif(not [cc for cc in COMPILERS if cc != 'tcc'], reason='needs gcc or clang: tcc builds '
                    'only the plain loops')
@pytest.mark.skipif(cpu.kernel_sets('') == ('base',), reason='this CPU has no vector set beyond the baseline')
def test_a_module_built_with_fewer_vector_sets_is_not_reused_where_more_are_wanted(fresh_cache, monkeypatch):
    """The kernels' unit of a build carries only the sets this machine picks
    ($MICROGRAD_KERNELS caps them): the cached module is keyed by them, so a
    build that wants more is built anew, not loaded with fewer."""
    cc = next(cc for cc in COMPILERS if cc != 'tcc')
    model = MLP(20, [16, 4], seed=0)
    x = [Value(0.25 * i) for i in range(20)]
    loss = sum(model(x))
    monkeypatch.setenv('MICROGRAD_KERNELS', 'base')
    few = compiler.compile(loss, x, model.parameters(), cc=cc)
    assert few.module.kernels == 'base'
    monkeypatch.delenv('MICROGRAD_KERNELS')
    more = compiler.compile(loss, x, model.parameters(), cc=cc)
    assert not more.build.cached and more.build.path != few.build.path
    assert more.module.kernels == cpu.kernel_sets('')[0]
    for m in (few, more):
        m.set_input([v.data for v in x])
        assert m.forward() == loss.data


@needs_cc
def test_a_unit_that_fails_ahead_leaves_nothing_and_says_nothing(tmp_path, fresh_cache):
    """The build that needs the unit reports a failure, with its context."""
    cc = fake_cc(str(tmp_path), 'badcc', 'echo "nn.c:1: error: no" >&2; exit 1')
    request = build.plan(Source('', [('module', ''), ('kernels', 'int x;')]), cc=cc)
    thread = build.build_unit_ahead(request, 'kernels', 'int x;')
    thread.join(60)
    assert not thread.is_alive()
    assert_nothing_half_written(fresh_cache)


@needs_cc
def test_concurrent_builds_of_one_graph_build_once(tmp_path):
    """Four processes start building the same graph at the same moment on an
    empty cache, through a compiler that takes a second: one builds, the
    others wait for it and load its object."""
    real = shutil.which(FAST_CC)
    log = tmp_path / 'invocations.log'
    cc = tmp_path / 'slowcc'
    cc.write_text(f'#!/bin/sh\ncase "$1" in -E|--version|-v) exec {real} "$@";; esac\n'
                  f'echo $$ >> {log}\nsleep 1\nexec {real} "$@"\n')
    cc.chmod(0o755)
    script = tmp_path / 'builder.py'
    script.write_text(BUILDER.format())
    env = {**os.environ, 'MICROGRAD_CACHE_DIR': str(tmp_path / 'cache')}
    env.pop('MICROGRAD_CACHE', None)
    n = 4
    # the repository's root on the path (as for pytest), so that `tests` imports
    env['PYTHONPATH'] = os.pathsep.join(filter(None, [REPO, env.get('PYTHONPATH')]))
    procs = [subprocess.Popen([sys.executable, str(script), str(i), str(tmp_path), str(cc)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
             for i in range(n)]
    try:
        deadline = time.monotonic() + 60
        while len(glob.glob(str(tmp_path / 'ready-*'))) < n and time.monotonic() < deadline:
            time.sleep(0.01)
        (tmp_path / 'go').touch()
        results = []
        for p in procs:
            out, err = p.communicate(timeout=120)
            assert p.returncode == 0, err
            results.append(json.loads(out.strip().splitlines()[-1]))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    # one build: a compiler run per translation unit, and one to link them
    loss, inputs, params, outputs = small_graph()
    source = compiler.emit_module(compiler.vectorize.vectorize(compiler.trace(loss, inputs, params, outputs)))
    runs = 1 if len(source.parts) == 1 else len(source.parts) + 1
    assert len(log.read_text().split()) == runs, "the graph was built more than once"
    assert sorted(r['built'] for r in results) == [False] * (n - 1) + [True]
    assert all(r['cached'] for r in results if not r['built'])
    assert len({r['path'] for r in results}) == 1 and len({r['loss'] for r in results}) == 1
    left = os.listdir(tmp_path / 'cache')
    assert [f for f in left if f.endswith('.so')] == [os.path.basename(results[0]['path'])]
    assert not [f for f in left if f.startswith('.tmp-')]


# -- other Python versions ---------------------------------------------------------------

def other_pythons():
    """Interpreters newer than this one, with their headers: (executable, version, include)."""
    roots = [os.environ.get('PYENV_ROOT') or os.path.expanduser('~/.pyenv')]
    candidates = set()
    for root in roots:
        candidates.update(glob.glob(os.path.join(root, 'versions', '3.*', 'bin', 'python3')))
    for name in ('python3.12', 'python3.13', 'python3.14'):
        for folder in ('/usr/bin', '/usr/local/bin'):
            if os.path.exists(os.path.join(folder, name)):
                candidates.add(os.path.join(folder, name))
    found = {}
    for exe in sorted(candidates):
        try:
            r = subprocess.run([exe, '-c', 'import sys, sysconfig; print(sys.version_info[0], '
                                'sys.version_info[1], sysconfig.get_paths()["include"])'],
                               capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            continue
        if r.returncode:
            continue
        major, minor, include = r.stdout.split(maxsplit=2)
        version = (int(major), int(minor))
        include = include.strip()
        if version > sys.version_info[:2] and os.path.isfile(os.path.join(include, 'Python.h')):
            found.setdefault(version, (exe, include))
    return [(exe, f'{v[0]}.{v[1]}', include) for v, (exe, include) in sorted(found.items())]


OTHER_PYTHONS = other_pythons()

RUNNER = textwrap.dedent('''\
    import importlib.machinery, importlib.util, json, sys
    from array import array
    loader = importlib.machinery.ExtensionFileLoader('nn', sys.argv[1])
    spec = importlib.util.spec_from_file_location('nn', sys.argv[1], loader=loader)
    m = importlib.util.module_from_spec(spec)
    loader.exec_module(m)
    m.write_params(array('d', json.loads(sys.argv[2])))
    m.set_input([0.5, -0.5, 1.0])
    loss = m.forward()
    m.backward()
    grads = array('d', [0.0] * m.n_params)
    m.read_grads(grads)
    try:
        m.read_grads(array('f', [0.0] * m.n_params))
    except TypeError as e:
        refused = str(e)
    print(json.dumps({'version': sys.version.split()[0], 'loss': loss.hex(),
                      'grads': [g.hex() for g in grads], 'refused': refused}))
''')


def _run_elsewhere(exe, so, params, tmp_path):
    script = tmp_path / 'runner.py'
    script.write_text(RUNNER)
    r = subprocess.run([exe, str(script), so, json.dumps(list(params))],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


@needs_cc
@pytest.mark.skipif(not OTHER_PYTHONS, reason="no newer Python with headers is installed")
@pytest.mark.parametrize('exe, version, include', OTHER_PYTHONS, ids=[v for _, v, _ in OTHER_PYTHONS])
@pytest.mark.parametrize('cc', COMPILERS)
def test_the_module_builds_against_newer_python_headers_and_runs_there(cc, exe, version, include,
                                                                       tmp_path, fresh_cache):
    """The limited API lets tcc (which lacks the C11 atomics of the 3.13
    headers' non-limited parts) build against them; the module then runs in
    that interpreter and computes what it computes here."""
    loss, inputs, params, outputs = small_graph()
    model = compiler.compile(loss, inputs, params, outputs, cc=cc)
    model.set_input([0.5, -0.5, 1.0])
    here = {'loss': model.forward().hex()}
    model.backward()
    # the module's own parameter block (a pass may have permuted the order)
    block = np.empty(model.n_params)
    model.module.read_grads(block)
    here['grads'] = [float(g).hex() for g in block]
    model.module.read_params(block)
    tc = find_compiler(cc)
    there = build_extension(model.source, tc, default_flags(tc), include_dir=include)
    assert there.path != model.build.path          # the headers are part of the key
    got = _run_elsewhere(exe, there.path, list(block), tmp_path)
    assert got['version'].startswith(version)
    assert (got['loss'], got['grads']) == (here['loss'], here['grads'])
    assert "format 'f'" in got['refused']
    # the stable ABI: the object built here against this Python's headers loads there too
    got = _run_elsewhere(exe, model.build.path, list(block), tmp_path)
    assert (got['loss'], got['grads']) == (here['loss'], here['grads'])
