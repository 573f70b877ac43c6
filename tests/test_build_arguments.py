"""Careless arguments and settings get a clear error, or just work (issue 13, item 14).

"The generated C is at fault: please report it" is said only when that is
likely: an error the compiler reports in the generated source, with the
default flags. Programs that are not C compilers are recognised by
compiling, not by their version text; a ``$CC`` with flags works as it does
for make; ``flags``, ``opt``, ``timeout``, ``$MICROGRAD_CC_TIMEOUT`` and
``$MICROGRAD_CACHE`` are checked or read generously.
"""
import math
import os
import shutil
import subprocess
import sys
import textwrap

import pytest

from compiler import build
from compiler.build import (CompileError, CompilerNotFound, build_extension, cache_dir, default_flags,
                            find_compiler)

from tests.differential import COMPILERS, FAST_CC, needs_cc
from tests.test_build import REPO, assert_explains, compile_tiny, fake_cc, fresh_cache  # noqa: F401

REPORT = 'please report'


# -- what is a C compiler -------------------------------------------------------------------

@pytest.mark.parametrize('program', ['/bin/true', 'cat', sys.executable, 'python3'])
def test_programs_that_are_not_c_compilers_are_not_taken_for_gcc(program):
    """``true --version`` and ``cat --version`` name the Free Software
    Foundation, ``python3 -v`` prints '[GCC 12.2.0]'."""
    if not shutil.which(program):
        pytest.skip(f'{program} is not installed')
    with pytest.raises(CompilerNotFound) as e:
        find_compiler(program)
    assert_explains(e.value, 'does not identify itself as clang, gcc or tcc', '__GNUC__', 'apt-get install')


@pytest.mark.parametrize('program', ['/bin/true', 'cat'])
def test_compile_with_a_program_that_is_not_a_c_compiler_never_blames_the_generated_c(program):
    with pytest.raises(CompilerNotFound) as e:
        compile_tiny(cc=program)
    assert REPORT not in str(e.value)


@pytest.mark.parametrize('cc', COMPILERS)
def test_each_real_compiler_is_identified_by_its_macros(cc):
    tc = find_compiler(cc)
    assert tc.family == cc and tc.args == ()
    assert tc.version.strip()



def test_an_identity_found_is_kept_in_the_cache_until_the_program_changes(monkeypatch, fresh_cache, tmp_path):
    """A later process reads a compiler's identity from the cache folder
    instead of running its probes; a program replaced or touched, a kept
    file that does not fit, or no cache folder: probed again."""
    from compiler.build import toolchain
    cc = os.path.realpath(fake_cc(str(tmp_path), 'mycc', 'exit 1'))
    probes = []
    real_run = subprocess.run

    def counted(cmd, *args, **kwargs):
        probes.append(cmd[0])
        return real_run(cmd, *args, **kwargs)
    monkeypatch.setattr(toolchain.subprocess, 'run', counted)
    identify = toolchain._identify.__wrapped__          # a new process: nothing in memory
    first = identify(cc)
    assert first.family == 'gcc' and first.version == 'gcc (Fake) 12.2.0' and len(probes) == 2
    kept = os.listdir(os.path.join(fresh_cache, 'toolchains'))
    assert len(kept) == 1
    assert identify(cc) == first and len(probes) == 2                 # read back, no probe
    os.utime(cc, ns=(1, 1))                                          # touched
    assert identify(cc) == first and len(probes) == 4
    assert identify(cc) == first and len(probes) == 4
    with open(os.path.join(fresh_cache, 'toolchains', kept[0]), 'w') as f:
        f.write('{"path": 1')                                          # cut short
    assert identify(cc) == first and len(probes) == 6
    assert identify(cc) == first and len(probes) == 6
    monkeypatch.setenv('MICROGRAD_CACHE', '0')
    assert identify(cc) == first and len(probes) == 8
    assert identify(cc) == first and len(probes) == 10

@pytest.mark.skipif(not shutil.which('gcc'), reason='needs gcc')
def test_cc_with_flags_works_as_make_allows(monkeypatch, fresh_cache, tmp_path):
    monkeypatch.setenv('CC', 'gcc -std=c99')
    tc = find_compiler()
    assert tc.family == 'gcc' and tc.args == ('-std=c99',)
    m = compile_tiny()
    assert m.build.cmd[:2] == [tc.path, '-std=c99']
    m.set_input([0.5])
    assert m.forward() == math.tanh(0.5 * 2.0 + 1.0)
    plain = compile_tiny(cc='gcc')                 # the leading flags are part of the key
    assert plain.build.path != m.build.path
    # a quoted path with a space, as a shell reads it; and the cc argument too
    spaced = tmp_path / 'my tools'
    spaced.mkdir()
    (spaced / 'gcc').symlink_to(shutil.which('gcc'))
    monkeypatch.setenv('CC', f'"{spaced / "gcc"}" -O1')
    assert find_compiler().args == ('-O1',)
    assert find_compiler(str(spaced / 'gcc')).args == ()          # an existing path as it is
    assert find_compiler('gcc -std=gnu11').args == ('-std=gnu11',)
    assert find_compiler(['gcc', '-std=gnu11']).args == ('-std=gnu11',)
    assert find_compiler(spaced / 'gcc').family == 'gcc'                # a pathlib.Path
    with pytest.raises(TypeError, match='cc must be a str'):
        find_compiler(3)
    monkeypatch.setenv('CC', 'gcc "-std=c99')
    with pytest.raises(CompilerNotFound, match='cannot be split'):
        find_compiler()


# -- flags, opt, timeout ---------------------------------------------------------------------

def test_flags_given_as_one_string_are_refused_with_what_to_write(fresh_cache):
    with pytest.raises(TypeError) as e:
        compile_tiny(flags='-O2 -shared -fPIC')
    assert_explains(e.value, "not the string '-O2 -shared -fPIC'", "shlex.split('-O2 -shared -fPIC')")
    if FAST_CC:
        tc = find_compiler(FAST_CC)
        with pytest.raises(TypeError, match='shlex.split'):
            build_extension('int x;\n', tc, '-O2 -shared -fPIC')
    with pytest.raises(TypeError, match='each flag must be a str'):
        compile_tiny(flags=['-O2', 3])
    assert os.listdir(fresh_cache) == [] if os.path.isdir(fresh_cache) else True


@pytest.mark.parametrize('opt, words', [
    ('O2', ["did you mean '-O2'"]),
    ('-O3 -funroll-loops', ['flags=[...]']),
    ('-Ofast', ['fast-math', 'IEEE', "use '-O3'"]),
    ('-O4', ['-O0, -O1, -O2, -O3']),
])
def test_an_opt_that_is_not_a_level_is_refused(opt, words):
    tc = build.Toolchain('/usr/bin/gcc', 'gcc', 'gcc 12')
    with pytest.raises(ValueError) as e:
        default_flags(tc, opt)
    assert_explains(e.value, *words)
    if FAST_CC:
        with pytest.raises(ValueError):
            compile_tiny(cc=FAST_CC, opt=opt)
        with pytest.raises(ValueError):                          # also beside flags=
            compile_tiny(cc=FAST_CC, opt=opt, flags=['-shared', '-fPIC'])


@pytest.mark.parametrize('cc', [c for c in ('clang', 'gcc') if shutil.which(c)])
def test_every_level_is_accepted(cc, fresh_cache):
    tc = find_compiler(cc)
    assert [default_flags(tc, opt)[0] for opt in build.OPT_LEVELS] == list(build.OPT_LEVELS)
    for opt in ('-O0', '-Oz'):                 # the quickest, and the newest (gcc 12)
        m = compile_tiny(cc=cc, opt=opt)
        assert m.build.flags[0] == opt
        m.set_input([0.5])
        assert m.forward() == math.tanh(0.5 * 2.0 + 1.0)


@needs_cc
def test_an_infinite_timeout_means_no_timeout(monkeypatch):
    monkeypatch.setenv('MICROGRAD_CACHE', '0')      # so that the compiler runs
    assert compile_tiny(cc=FAST_CC, timeout=float('inf')).build.cmd is not None
    assert compile_tiny(cc=FAST_CC, timeout=60).build.cmd is not None
    assert compile_tiny(cc=FAST_CC, timeout=10 ** 400).build.cmd is not None    # beyond a float


@needs_cc
@pytest.mark.parametrize('timeout, error', [(float('nan'), ValueError), (0, ValueError),
                                            (-1.0, ValueError), ('600', TypeError),
                                            (None, TypeError), (True, TypeError)])
def test_a_timeout_that_is_not_a_positive_number_is_refused(timeout, error):
    with pytest.raises(error, match='timeout'):
        compile_tiny(cc=FAST_CC, timeout=timeout)


def import_compiler_with(env):
    env = {**os.environ, **env,
           'PYTHONPATH': os.pathsep.join(filter(None, [REPO, os.environ.get('PYTHONPATH')]))}
    return subprocess.run([sys.executable, '-c', 'import compiler.build as b; print(b.DEFAULT_TIMEOUT)'],
                          capture_output=True, text=True, env=env, timeout=120)


def test_import_compiler_survives_a_bad_cc_timeout_in_the_environment():
    r = import_compiler_with({'MICROGRAD_CC_TIMEOUT': 'abc'})
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == '600.0'
    assert "MICROGRAD_CC_TIMEOUT='abc' is not a positive number of seconds: using 600 s" in r.stderr


@pytest.mark.parametrize('value', ['-5', '0', 'nan', '1e999x', 'ten'])
def test_a_bad_cc_timeout_in_the_environment_warns_and_keeps_the_default(value, monkeypatch):
    monkeypatch.setenv('MICROGRAD_CC_TIMEOUT', value)
    with pytest.warns(UserWarning, match='MICROGRAD_CC_TIMEOUT'):
        assert build.flags._timeout_from_environment() == 600


@pytest.mark.parametrize('value, seconds', [('30', 30), (' 2.5 ', 2.5), ('inf', math.inf), ('', 600)])
def test_a_good_cc_timeout_in_the_environment_is_used(value, seconds, monkeypatch, recwarn):
    monkeypatch.setenv('MICROGRAD_CC_TIMEOUT', value)
    assert build.flags._timeout_from_environment() == seconds
    assert not recwarn.list


# -- MICROGRAD_CACHE -------------------------------------------------------------------------

@pytest.mark.parametrize('value', ['0', 'FALSE', 'false', 'off', 'Off', ' 0', 'no', 'NO ', ' No'])
def test_the_cache_is_disabled_by_any_spelling_of_no(value, monkeypatch, fresh_cache):
    monkeypatch.setenv('MICROGRAD_CACHE', value)
    assert cache_dir() is None
    if FAST_CC:
        assert compile_tiny(cc=FAST_CC).build.temporary
    assert not os.path.exists(fresh_cache)


@pytest.mark.parametrize('value', ['1', 'yes', 'on', 'TRUE', ''])
def test_the_cache_stays_on_otherwise(value, monkeypatch, fresh_cache):
    monkeypatch.setenv('MICROGRAD_CACHE', value)
    assert cache_dir() == fresh_cache


# -- "please report" only when likely --------------------------------------------------------

@needs_cc
@pytest.mark.parametrize('cc', COMPILERS)
def test_an_error_in_the_generated_c_asks_for_a_report(cc, fresh_cache):
    tc = find_compiler(cc)
    with pytest.raises(CompileError) as e:
        build_extension('int broken(void) { return }\n', tc, default_flags(tc))
    assert_explains(e.value, 'the generated C is at fault', REPORT)


@needs_cc
@pytest.mark.parametrize('cc', COMPILERS)
def test_flags_the_user_gave_are_blamed_before_the_generated_c(cc, fresh_cache):
    """Without -shared the linker wants a main(): the flags are at fault."""
    with pytest.raises(CompileError) as e:
        compile_tiny(cc=cc, flags=['-O2'])
    assert_explains(e.value, 'with the flags you gave', "flags=['-O2']")
    assert REPORT not in str(e.value)


@needs_cc
@pytest.mark.parametrize('cc', COMPILERS)
def test_flags_in_the_compiler_command_are_blamed_before_the_generated_c(cc, fresh_cache):
    """``CC='gcc -Dreturn=@'``: a define that breaks every function."""
    with pytest.raises(CompileError) as e:
        compile_tiny(cc=f'{cc} -Dreturn=@')
    assert_explains(e.value, 'with the flags you gave', '-Dreturn=@ from the compiler command')
    assert REPORT not in str(e.value)


def test_a_compiler_without_output_is_not_a_fault_of_the_generated_c(tmp_path, fresh_cache):
    cc = fake_cc(str(tmp_path), 'lazycc', 'exit 0')
    with pytest.raises(CompileError) as e:
        compile_tiny(cc=cc)
    assert_explains(e.value, 'exited 0 but wrote no shared object', 'a working C compiler')
    assert REPORT not in str(e.value)


def test_a_crashing_compiler_is_not_a_fault_of_the_generated_c(tmp_path, fresh_cache):
    cc = fake_cc(str(tmp_path), 'icecc', textwrap.dedent('''\
        echo "during RTL pass: expand" >&2
        echo "internal compiler error: Segmentation fault" >&2
        exit 4'''))
    with pytest.raises(CompileError) as e:
        compile_tiny(cc=cc)
    assert_explains(e.value, 'its own words are below', 'internal compiler error')
    assert REPORT not in str(e.value)


@needs_cc
@pytest.mark.parametrize('cc', COMPILERS)
def test_a_quote_and_a_backslash_in_the_cache_path_are_fine(cc, tmp_path, monkeypatch):
    """tcc writes the source's path into a #define of its own, unescaped."""
    folder = tmp_path / 'a "quote and a \\ backslash'
    monkeypatch.setenv('MICROGRAD_CACHE_DIR', str(folder))
    monkeypatch.delenv('MICROGRAD_CACHE', raising=False)
    m = compile_tiny(cc=cc)
    assert os.path.dirname(m.build.path) == str(folder)
    m.set_input([0.5])
    assert m.forward() == math.tanh(0.5 * 2.0 + 1.0)
    with pytest.raises(CompileError) as e:                    # and errors still point at the source
        build_extension('int broken(void) { return }\n', find_compiler(cc), default_flags(find_compiler(cc)))
    assert_explains(e.value, REPORT, str(folder))
