"""Build C source into a CPython extension, with an on-disk cache.

Compiler: the ``cc`` argument (``'tcc'``, ``'clang'``, ``'gcc'``, a path, or
a command with leading flags such as ``'gcc -std=c99'``), else ``$CC`` (split
as a shell would, as make does: the first word is the compiler, the rest lead
its flags), else the first of clang, gcc, tcc, cc found on ``PATH``. A
program counts as clang, gcc or tcc only if preprocessing a probe with it
expands that compiler's predefined macros (``__clang__``, ``__GNUC__``,
``__TINYC__``): version texts are not evidence (``cat --version`` names the
Free Software Foundation).

Flags: a list of strings, one flag each (a single string is refused with a
``TypeError``: ``shlex.split`` it). ``flags=`` replaces the defaults, which
keep IEEE semantics (no fast-math, no contraction into FMA); ``opt`` is one
of ``OPT_LEVELS`` (``-Ofast`` is refused: it is fast-math). ``native=True``
adds ``-march=native``, and the cache key then holds what that resolves to
on this machine (the compiler's own expansion, else the CPU's flags), so a
cache shared between machines never serves code this CPU cannot run.

Timeout: seconds (``float('inf')``: none), default ``$MICROGRAD_CC_TIMEOUT``
or 600. The compiler runs in a process group of its own that is killed on a
timeout, on Ctrl-C, on SIGTERM or SIGHUP (see ``files.terminate_cleanly``),
and when this process dies, even by SIGKILL (Linux: a death signal, see
``files.run_in_own_group``).

The Python headers are those of the running interpreter, or the folder named
by ``$MICROGRAD_PYTHON_INCLUDE`` (or the ``include_dir`` argument).

Checks: a new shared object is used or recorded only once it is a non-empty
ELF shared object for this machine (class, byte order, machine) whose
segments all lie within the file, and (built against this interpreter's
headers) it loads in a child Python -- so a damaged one can crash only the
child -- and reports the ``program_hash`` its source declares. ``KEY.sha256``
records the checksum and that these checks passed; an entry without it,
with another checksum, or failing the ELF check is rebuilt.

Cache: ``$MICROGRAD_CACHE_DIR``, else ``$XDG_CACHE_HOME/micrograd-compiler``,
else ``~/.cache/micrograd-compiler``; ``MICROGRAD_CACHE`` set to ``0``,
``false``, ``no`` or ``off`` (any case) builds in a temporary folder instead.
A shared object that someone else can replace would run as the user, so the
folder is the user's alone: it is created with mode 0o700; the default
folder, if it exists with wider permissions, is narrowed to 0o700; a
``$MICROGRAD_CACHE_DIR`` is left as it is, but refused if another user owns
it or it is writable by group or others. Entries are keyed by a hash of
everything that decides the binary, written under a file lock to a temporary
name and renamed into place; a failed build leaves no shared object and no
checksum, only its source. Each use of an entry marks it (its mtime). A
build first sweeps the temporaries of dead builds (killed ones), and
afterwards removes least recently used entries (failed builds' sources
first, never the one just built) until the folder's entries total at most
``$MICROGRAD_CACHE_MAX`` (``500M``, ``2G``...; default 1 GiB).
``python -m compiler cache --info``/``--clear`` show and empty it.

A ``$MICROGRAD_CACHE_DIR`` that cannot be used (not a folder, read-only,
unwritable, full) raises ``CacheError`` naming it; the default folder being
unusable (no home folder, read-only, full...) makes builds fall back to a
private temporary folder, with one ``UserWarning`` per process.
"""
import concurrent.futures
import functools
import hashlib
import math
import numbers
import os
import re
import shlex
import shutil
import signal
import stat
import struct
import subprocess
import sys
import sysconfig
import tempfile
import threading
import warnings
from dataclasses import dataclass

from compiler.files import (DEFAULT_CACHE_MAX, cache_root, disk_is_full, entry_lock, evict,
                            is_out_of_space, parse_size, remove_if_present, run_in_own_group,
                            sha256_file, sweep_temporaries, terminate_cleanly, touch,
                            write_atomically)

PREFERRED = ('clang', 'gcc', 'tcc', 'cc')
INSTALL_HINT = "install one, e.g. 'apt-get install clang tcc' or 'apt-get install gcc'"
TIMEOUT_FALLBACK = 600.0


def _timeout_from_environment():
    """``$MICROGRAD_CC_TIMEOUT`` in seconds (``inf``: none); a value that is not
    a positive number warns and gives 600, so that ``import compiler`` works."""
    text = os.environ.get('MICROGRAD_CC_TIMEOUT', '').strip()
    if not text:
        return TIMEOUT_FALLBACK
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if math.isnan(value) or value <= 0:
        warnings.warn(f"MICROGRAD_CC_TIMEOUT={text!r} is not a positive number of seconds: "
                      f"using {TIMEOUT_FALLBACK:g} s", UserWarning, stacklevel=2)
        return TIMEOUT_FALLBACK
    return value


DEFAULT_TIMEOUT = _timeout_from_environment()


class BuildError(RuntimeError):
    """A build failed; ``cmd``, ``returncode``, ``stderr`` and ``source_path`` say how."""

    def __init__(self, message, cmd=None, returncode=None, stderr='', source_path=None, cwd=None):
        self.cmd, self.returncode, self.stderr, self.source_path = cmd, returncode, stderr, source_path
        details = []
        if cmd:
            details.append('command: ' + ' '.join(cmd))
        if cwd:
            details.append(f'run in: {cwd}')
        if returncode is not None:
            details.append(f'exit status: {returncode}')
        if stderr:
            details.append('stderr (first lines):\n  ' + '\n  '.join(stderr.splitlines()[:20]))
        if source_path:
            details.append(f'C source kept at: {source_path}')
        super().__init__('\n'.join([message] + details))


class CompilerNotFound(BuildError):
    pass


class HeadersNotFound(BuildError):
    pass


class CompileError(BuildError):
    pass


class CompileTimeout(BuildError):
    pass


class CacheError(BuildError):
    """The build folder (the cache, or a temporary folder) cannot be used:
    not a folder, read-only, unwritable, someone else's, or a full disk.
    ``reason`` says what is wrong, without what to do."""

    def __init__(self, message, reason=None, **details):
        self.reason = reason or message
        super().__init__(message, **details)


# -- the compiler ------------------------------------------------------------------------

@dataclass(frozen=True)
class Toolchain:
    path: str
    family: str     # 'clang', 'gcc' or 'tcc'
    version: str    # first line of the compiler's own version text
    args: tuple = ()   # leading flags that came with the command ('gcc -std=c99')

    @property
    def name(self):
        return f'{self.family} ({os.path.basename(self.path)})'


# Preprocessed by a real compiler, the last line becomes e.g.
# `micrograd_compiler_is_gcc 12 2 0`; that token exists nowhere in this text,
# so a program that echoes its input (cat) or ignores it (true) shows nothing.
IDENTIFY_PROBE = '''\
#define MG_PASTE(a, b) a ## b
#define MG_ID(family) MG_PASTE(micrograd_compiler_is_, family)
#if defined(__TINYC__)
MG_ID(tcc) __TINYC__
#elif defined(__clang__)
MG_ID(clang) __clang_major__ __clang_minor__ __clang_patchlevel__
#elif defined(__GNUC__)
MG_ID(gcc) __GNUC__ __GNUC_MINOR__ __GNUC_PATCHLEVEL__
#endif
'''
IDENTIFIED = re.compile(r'micrograd_compiler_is_(tcc|clang|gcc)\b([ \d]*)')


@functools.lru_cache(maxsize=None)
def _identify(path, args=()):
    """The ``Toolchain`` of the program at ``path`` (run with ``args`` first),
    from the macros it predefines when it preprocesses ``IDENTIFY_PROBE``."""
    try:
        r = subprocess.run([path, *args, '-E', '-x', 'c', '-'], input=IDENTIFY_PROBE,
                           capture_output=True, text=True, errors='replace', timeout=30)
        found = IDENTIFIED.search(r.stdout) if r.returncode == 0 else None
    except (OSError, subprocess.TimeoutExpired):
        found = None
    if not found:
        raise CompilerNotFound(f"{' '.join([path, *args])} does not identify itself as clang, gcc or "
                               "tcc: preprocessing a test file with it did not expand their "
                               f"predefined macros (__clang__, __GNUC__, __TINYC__); {INSTALL_HINT}")
    family = found.group(1)
    version = f"{family} {'.'.join(found.group(2).split())}"
    try:     # the first line of the version text names the build too (Debian's, Apple's)
        r = subprocess.run([path, '-v' if family == 'tcc' else '--version'],
                           capture_output=True, text=True, errors='replace', timeout=30)
        first = (r.stdout + r.stderr).strip().splitlines()
        if first:
            version = first[0]
    except (OSError, subprocess.TimeoutExpired):
        pass
    return Toolchain(path, family, version, tuple(args))


def _command_words(command, where):
    """``command`` as a list of words: a sequence as it is, a string naming
    an existing program as it is (a path may hold spaces), otherwise split
    like a shell would."""
    if isinstance(command, os.PathLike):
        command = os.fspath(command)
    if not isinstance(command, str):
        words = list(command) if isinstance(command, (list, tuple)) else None
        if not words or not all(isinstance(w, str) for w in words):
            raise TypeError(f"{where} must be a str or a list of str, not {command!r}")
        return words
    if shutil.which(command):
        return [command]
    try:
        words = shlex.split(command)
    except ValueError as e:
        raise CompilerNotFound(f"{where}={command!r} cannot be split into words ({e}); "
                               "quote it as a shell would") from None
    return words or [command]


def find_compiler(cc=None):
    """The ``Toolchain`` for ``cc`` (a name, a path or a command with leading
    flags), else ``$CC``, else the best available."""
    if cc is not None:
        commands = [_command_words(cc, 'cc')]
    elif os.environ.get('CC', '').strip():
        commands = [_command_words(os.environ['CC'], '$CC')]
    else:
        commands = [[name] for name in PREFERRED]
    for words in commands:
        path = shutil.which(words[0])
        if path:
            return _identify(os.path.realpath(path), tuple(words[1:]))
    tried = ', '.join(' '.join(w) for w in commands)
    raise CompilerNotFound(f"no C compiler found (tried {tried}); {INSTALL_HINT}")


# -- flags, levels, timeouts -------------------------------------------------------------

# The level that trains fastest with each compiler (benchmarks/bench_mnist.py):
# gcc 12 vectorizes loops only at -O3.
DEFAULT_OPT = {'clang': '-O2', 'gcc': '-O3'}
# -Ofast is not here: it turns on -ffast-math, which reorders and fuses the
# roundings that make the compiled results the interpreter's, bit for bit.
OPT_LEVELS = ('-O0', '-O1', '-O2', '-O3', '-Os', '-Oz', '-Og')


def check_opt(opt):
    """``opt`` if it is ``None`` or one of ``OPT_LEVELS``; else a ``ValueError`` saying what to pass."""
    if opt is None or opt in OPT_LEVELS:
        return opt
    if not isinstance(opt, str):
        raise TypeError(f"opt must be a str such as '-O2', not {type(opt).__name__}")
    if opt == '-Ofast':
        raise ValueError("opt='-Ofast' is refused: it turns on fast-math, which breaks the IEEE "
                         "exactness of the compiled module (its results are the interpreter's, bit "
                         "for bit); use '-O3'")
    hint = f" (did you mean {'-' + opt!r}?)" if '-' + opt in OPT_LEVELS else ''
    raise ValueError(f"opt must be one of {', '.join(OPT_LEVELS)}, not {opt!r}{hint}; other flags "
                     "go in flags=[...], which replaces the default flags")


def check_flags(flags):
    """``flags`` as a new list of str, one flag each; a single string is refused."""
    if isinstance(flags, (str, bytes)):
        raise TypeError(f"flags must be a list of strings, one flag each, not the string {flags!r} "
                        f"(which would be read one character at a time): write "
                        f"flags=shlex.split({flags!r}) or a list such as ['-O2', '-shared', '-fPIC']")
    try:
        flags = list(flags)
    except TypeError:
        raise TypeError(f"flags must be a list of strings, not {type(flags).__name__}") from None
    for flag in flags:
        if not isinstance(flag, str):
            raise TypeError(f"each flag must be a str, not {type(flag).__name__} ({flag!r})")
    return flags


def check_timeout(timeout):
    """Seconds to wait for the compiler, ``None`` for ``float('inf')`` (no limit);
    NaN, zero or negative are a ``ValueError``."""
    if isinstance(timeout, bool) or not isinstance(timeout, numbers.Real):
        raise TypeError(f"timeout must be a number of seconds, not {type(timeout).__name__}")
    try:
        timeout = float(timeout)
    except OverflowError:              # an int beyond float: as good as no limit
        timeout = math.inf if timeout > 0 else -math.inf
    if math.isnan(timeout) or timeout <= 0:
        raise ValueError(f"timeout must be a positive number of seconds (float('inf') for no "
                         f"limit), not {timeout!r}")
    return None if math.isinf(timeout) else timeout


def default_flags(toolchain, opt=None, native=False):
    """Flags that keep IEEE double semantics: no fast-math, no FMA contraction.

    ``opt`` is one of ``OPT_LEVELS`` (default: the fastest for the compiler;
    tcc has one level). ``native`` adds ``-march=native`` (opt-in: the build
    then runs only on machines like this one).
    """
    check_opt(opt)
    if toolchain.family == 'tcc':
        return ['-shared', '-fPIC']
    flags = [opt or DEFAULT_OPT[toolchain.family], '-shared', '-fPIC',
             '-ffp-contract=off', '-fno-fast-math', '-w']
    if toolchain.family == 'gcc':
        # gcc keeps a loop's array of running sums in registers only once it
        # has unrolled the loop over it, by default up to 16 iterations; the
        # vector ops' loops keep 64 (placeholder home: the build engineer's)
        flags += ['--param=max-completely-peel-times=64',
                  '--param=max-completely-peeled-insns=2000']
    return flags + ['-march=native'] if native else flags


# Seconds one core spends per straight-line statement of generated code, by
# compiler and level (measured on microgpt's and MNIST's programs: clang 14,
# gcc 12, tcc 0.9.27, 2-core AMD EPYC). clang and gcc are far slower per
# statement than tcc, and more so the more they optimise.
COMPILE_SECONDS = {('clang', '-O2'): 3.4e-4, ('clang', '-O1'): 2.4e-4, ('clang', '-O0'): 7e-5,
                   ('gcc', '-O3'): 4.0e-4, ('gcc', '-O1'): 3.4e-4, ('gcc', '-O0'): 1.2e-4,
                   ('tcc', None): 3e-6}
# What a build with default arguments may spend compiling straight-line code.
COMPILE_BUDGET = 4.0
# Straight-line statements per line of the module's part that calls them
# (a declaration and a call per function of about 100 statements).
STATEMENTS_PER_CALL = 50
# Default builds, fastest code first: (compiler, level, level of the
# straight-line parts; None: the same; 'tcc': built by tcc). The loop kernels
# and the module's own code are a fixed couple of thousand lines, always worth
# optimising; straight-line code gains less from -O1 than it costs. microgpt,
# 42k statements: compile 5.6 s and 0.074 ms a step at -O1; 2.5 s and 0.069 ms
# with the straight-line parts at -O0; 1.9 s and 0.08-0.10 ms with them built
# by tcc (whose objects link into clang's or gcc's module).
DEFAULT_BUILDS = (('clang', '-O2', None), ('gcc', '-O3', None), ('clang', '-O1', None), ('gcc', '-O1', None),
                  ('clang', '-O1', '-O0'), ('gcc', '-O1', '-O0'), ('clang', '-O1', 'tcc'), ('gcc', '-O1', 'tcc'),
                  ('tcc', None, None))


def _cores():
    return len(os.sched_getaffinity(0)) if hasattr(os, 'sched_getaffinity') else os.cpu_count() or 1


def compile_estimate(family, opt, statements, parts=1):
    """Seconds a build of ``statements`` straight-line statements in
    ``parts`` translation units may take (the parts build in parallel);
    ``opt='tcc'``: those parts built by tcc."""
    if opt == 'tcc':
        family, opt = 'tcc', None
    cost = COMPILE_SECONDS.get((family, opt if family != 'tcc' else None), 3.4e-4)
    return statements * cost / max(1, min(parts, _cores()))


def build_estimate(family, level, straight, statements, parts=1):
    """``compile_estimate`` of a build at ``level`` whose straight-line parts
    are at ``straight`` (None: the same level; ``'tcc'``: built by tcc)."""
    seconds = compile_estimate(family, straight or level, statements, parts)
    if straight:    # the module's part declares and calls the straight-line functions, at `level`
        seconds += compile_estimate(family, level, statements / STATEMENTS_PER_CALL)
    return seconds


@dataclass(frozen=True)
class Choice:
    """What ``choose_build`` chose: the compiler, its level (None: the
    compiler's default), and the level of the straight-line parts (or
    ``'tcc'``, and ``straight_toolchain`` is tcc)."""
    toolchain: 'Toolchain'
    opt: str = None
    straight_opt: str = None
    straight_toolchain: 'Toolchain' = None

    def estimate(self, statements, parts):
        return build_estimate(self.toolchain.family, self.opt, self.straight_opt, statements, parts)


def choose_build(cc=None, opt=None, statements=0, parts=1):
    """A ``Choice``: what was asked for, else chosen by the program's size.
    The fastest code whose compile fits in ``COMPILE_BUDGET`` seconds (see
    ``DEFAULT_BUILDS``): clang -O2 or gcc -O3 for the programs the
    vectorizing pass makes small, -O1 for larger ones, then -O1 with the
    straight-line parts at -O0, then built by tcc (not when ``cc`` names the
    compiler), and tcc alone for straight-line programs of
    hundreds of thousands of statements, which the optimising compilers take
    minutes over and barely speed up. An ``opt`` given is used for every
    part."""
    def fits(family, level, straight):
        return build_estimate(family, level, straight, statements, parts) <= COMPILE_BUDGET

    if cc is not None or os.environ.get('CC', '').strip():
        toolchain = find_compiler(cc)
        if opt is not None or toolchain.family == 'tcc':
            return Choice(toolchain, opt)
        builds = [b for b in DEFAULT_BUILDS if b[0] == toolchain.family and b[2] != 'tcc']
        family, level, straight = next((b for b in builds if fits(*b)), builds[-1])
        return Choice(toolchain, level, straight)
    found = {}
    for family in ('clang', 'gcc', 'tcc'):
        try:
            found[family] = find_compiler(family)
        except CompilerNotFound:
            pass
    if not found:
        return Choice(find_compiler(None), opt)        # cc, or a clear error
    builds = [b for b in DEFAULT_BUILDS if b[0] in found and (b[2] != 'tcc' or 'tcc' in found)]
    family, level, straight = next((b for b in builds if fits(*b)), builds[-1])
    if opt is not None:
        level, straight = opt, None
    return Choice(found[family], level, straight, found['tcc'] if straight == 'tcc' else None)


def _are_default_flags(toolchain, flags):
    return any(flags == default_flags(toolchain, opt, native)
               for opt in (None, *OPT_LEVELS) for native in (False, True))


def _wants_native(flags):
    return any(f.split('=', 1)[0] in ('-march', '-mcpu', '-mtune') and f.endswith('=native')
               for f in flags)


@functools.lru_cache(maxsize=None)
def _native_target(toolchain):
    """What ``-march=native`` means here, as text for the cache key: clang's
    target CPU and features (``-###``), gcc's target options
    (``-Q --help=target``), else the CPU's identity and feature flags from
    ``/proc/cpuinfo``. Probed once per process and compiler."""
    cmd = [toolchain.path, *toolchain.args, '-march=native']
    try:
        if toolchain.family == 'clang':
            r = subprocess.run(cmd + ['-###', '-c', '-x', 'c', os.devnull],
                               capture_output=True, text=True, errors='replace', timeout=30)
            found = re.findall(r'"-(target-cpu|tune-cpu|target-feature)" "([^"]*)"', r.stderr)
            if found:
                return 'clang: ' + ' '.join(sorted(f'{k}={v}' for k, v in found))
        elif toolchain.family == 'gcc':
            r = subprocess.run(cmd + ['-Q', '--help=target'],
                               capture_output=True, text=True, errors='replace', timeout=30)
            if r.returncode == 0 and r.stdout.strip():
                return 'gcc: ' + ' '.join(' '.join(line.split()) for line in r.stdout.splitlines())
    except (OSError, subprocess.TimeoutExpired):
        pass
    try:
        with open('/proc/cpuinfo') as f:
            wanted = ('vendor_id', 'cpu family', 'model', 'flags', 'Features', 'CPU implementer',
                      'CPU part', 'isa')
            lines = {}
            for line in f:
                name, _, value = line.partition(':')
                if name.strip() in wanted:
                    lines.setdefault(name.strip(), ' '.join(value.split()))
        if lines:
            return 'cpuinfo: ' + '; '.join(f'{k}={v}' for k, v in sorted(lines.items()))
    except OSError:
        pass
    import platform
    return f'platform: {platform.machine()} {platform.processor()}'


# -- the Python headers --------------------------------------------------------------------

HEADERS_HINT = "install the Python development headers (e.g. 'apt-get install python3-dev')"


def python_include(include_dir=None):
    """The folder holding ``Python.h``: ``include_dir``, ``$MICROGRAD_PYTHON_INCLUDE``,
    or the running interpreter's."""
    return include_dir or os.environ.get('MICROGRAD_PYTHON_INCLUDE') or sysconfig.get_paths()['include']


def _check_headers(include, source_path):
    if not os.path.isfile(os.path.join(include, 'Python.h')):
        raise HeadersNotFound(f"Python.h is not in {include}: {HEADERS_HINT}", source_path=source_path)


# -- the cache folder ----------------------------------------------------------------------

CACHE_OFF = ('0', 'false', 'no', 'off')
_fallback_warned = False
_fallback_lock = threading.Lock()


def cache_disabled():
    """``$MICROGRAD_CACHE`` is 0, false, no or off (any case, spaces ignored)."""
    return os.environ.get('MICROGRAD_CACHE', '').strip().lower() in CACHE_OFF


def cache_chosen():
    """The cache folder is the user's choice (``$MICROGRAD_CACHE_DIR``), not the default."""
    return bool(os.environ.get('MICROGRAD_CACHE_DIR'))


def cache_max():
    """The cache's size cap in bytes: ``$MICROGRAD_CACHE_MAX``, default 1 GiB."""
    text = os.environ.get('MICROGRAD_CACHE_MAX', '').strip()
    if not text:
        return DEFAULT_CACHE_MAX
    try:
        return parse_size(text)
    except ValueError as e:
        raise CacheError(f"MICROGRAD_CACHE_MAX: {e}") from None


FREE_SPACE_HINT = ("free some space ('python -m compiler cache --clear' empties the build cache), "
                   "or set MICROGRAD_CACHE_DIR to a folder on another disk")


def _cache_problem(root, what, full=False):
    """The ``CacheError`` for the cache folder ``root``: says what failed and
    what to do (``full``: the disk is full)."""
    if full:
        todo = FREE_SPACE_HINT
    elif cache_chosen():
        todo = "make it a writable folder of your own, or set MICROGRAD_CACHE_DIR to another folder"
    else:
        todo = "set MICROGRAD_CACHE_DIR to a writable folder of your own"
    if cache_chosen():
        todo += ", or MICROGRAD_CACHE=0 to build without a cache"
    reason = f"the build cache folder {root} cannot be used: {what}"
    return CacheError(f"{reason}; {todo}", reason)


def cache_dir():
    """The build cache folder, created if needed, or ``None`` when
    ``$MICROGRAD_CACHE`` disables it. ``CacheError`` if it cannot be used."""
    if cache_disabled():
        return None
    root = os.path.abspath(cache_root())
    if not cache_chosen() and not os.environ.get('XDG_CACHE_HOME'):
        home = os.path.expanduser('~')
        if not (os.path.isabs(home) and os.path.isdir(home)):
            raise _cache_problem(root, f"the home folder {home!r} (HOME="
                                 f"{os.environ.get('HOME')!r}) does not exist")
    if os.path.exists(root) and not os.path.isdir(root):
        raise _cache_problem(root, "it is a file, not a folder")
    try:
        os.makedirs(root, mode=0o700, exist_ok=True)
        _check_private(root, narrow=not cache_chosen())
    except NotADirectoryError:
        raise _cache_problem(root, "a part of its path is a file, not a folder") from None
    except OSError as e:
        raise _cache_problem(root, _describe(e)) from None
    return root


def _describe(error):
    """An ``OSError`` in words, without the file name (the caller names it)."""
    return error.strerror or str(error) if isinstance(error, OSError) else str(error)


def _check_private(root, narrow):
    """Refuse a cache folder others can write to; ``narrow`` it to 0o700 instead if it is ours."""
    st = os.stat(root)
    mode = stat.S_IMODE(st.st_mode)
    if st.st_uid != os.getuid():
        reason = (f"the build cache folder {root} belongs to uid {st.st_uid}, not to this user "
                  f"(uid {os.getuid()})")
        raise CacheError(f"{reason}: set MICROGRAD_CACHE_DIR to a folder of your own", reason)
    if narrow and mode != 0o700:
        os.chmod(root, 0o700)
    elif mode & 0o022:
        reason = f"the build cache folder {root} is writable by others (mode {mode:#o})"
        raise CacheError(f"{reason}: run 'chmod go-w {root}' or set MICROGRAD_CACHE_DIR to a "
                         "private folder", reason)


def _warn_fallback(problem):
    """Say once per process that the default cache is unusable and builds are not cached."""
    global _fallback_warned
    with _fallback_lock:
        if _fallback_warned:
            return
        _fallback_warned = True
    warnings.warn(f"{problem}. Building in a private temporary folder instead: nothing is cached "
                  "(set MICROGRAD_CACHE_DIR to a writable folder, or MICROGRAD_CACHE=0 to build "
                  "without a cache and without this warning)", UserWarning, stacklevel=4)


def build_key(source, toolchain, flags, include_dir=None):
    """The cache key: a hash of the compiler's path, version and leading
    arguments, each flag (and, for ``-march=native``, what it resolves to
    here), the Python headers' folder and extension suffix, and the source
    (which names the generator's version). Each part is length-prefixed, so
    no two lists of parts collide."""
    parts = [toolchain.path, toolchain.version, *toolchain.args, '--', *flags, '--']
    if _wants_native(flags):
        parts.append(_native_target(toolchain))
    parts += [python_include(include_dir), sysconfig.get_config_var('EXT_SUFFIX') or '', source]
    h = hashlib.sha256()
    for part in parts:
        data = part.encode('utf-8', 'surrogateescape')
        h.update(len(data).to_bytes(8, 'little'))
        h.update(data)
    return h.hexdigest()[:32]


# -- checking a shared object --------------------------------------------------------------

# the prologue of nn.c (compiler/codegen/module.py): #define NN_PROGRAM_HASH "<16 hex digits>"
PROGRAM_HASH = re.compile(r'#define NN_PROGRAM_HASH "([0-9a-f]+)"')
VERIFIED = 'checked-1'        # KEY.sha256 is '<sha256> checked-1': written after the checks passed
LOAD_CHECK = '''\
import importlib.machinery, importlib.util, sys
loader = importlib.machinery.ExtensionFileLoader('nn', sys.argv[1])
spec = importlib.util.spec_from_file_location('nn', sys.argv[1], loader=loader)
module = importlib.util.module_from_spec(spec)
loader.exec_module(module)
print('program_hash=%s' % getattr(module, 'program_hash', None))
'''
LOAD_CHECK_TIMEOUT = 120


def program_hash(source):
    """The ``program_hash`` the generated module ``source`` declares, or ``None``."""
    m = PROGRAM_HASH.search(source)
    return m.group(1) if m else None


@functools.lru_cache(maxsize=None)
def _this_machine():
    """(class, byte order, machine) of this interpreter's ELF binary, or
    ``None`` where binaries are not ELF (the ELF checks are then skipped)."""
    for path in ('/proc/self/exe', sys.executable):
        try:
            with open(path, 'rb') as f:
                head = f.read(20)
        except OSError:
            continue
        if head[:4] == b'\x7fELF':
            endian = '<' if head[5] == 1 else '>'
            return head[4], head[5], struct.unpack_from(endian + 'H', head, 18)[0]
    return None


def elf_problem(path, kind=3):
    """What is wrong with the shared object (``kind`` 3; 1: an object file)
    at ``path`` that can be seen without loading it (empty, not ELF, another
    machine's, truncated), or ``None``."""
    try:
        size = os.path.getsize(path)
        with open(path, 'rb') as f:
            head = f.read(64)
            machine = _this_machine()
            if size == 0:
                return 'it is empty'
            if machine is None:
                return None
            if head[:4] != b'\x7fELF':
                return 'it is not an ELF file'
            if len(head) < 20:
                return f'it is truncated: {size} bytes, too short for an ELF header'
            if (head[4], head[5]) != machine[:2]:
                return (f'it is an ELF file of another class or byte order ({head[4]}, {head[5]}; '
                        f'this Python is {machine[0]}, {machine[1]})')
            if len(head) < (64 if head[4] == 2 else 52):
                return f'it is truncated: {size} bytes, too short for an ELF header'
            e = '<' if head[5] == 1 else '>'
            wide = head[4] == 2
            e_type, e_machine = struct.unpack_from(e + 'HH', head, 16)
            if e_machine != machine[2]:
                return f'it is for another machine (ELF machine {e_machine}, this Python is {machine[2]})'
            if e_type != kind:
                return f'it is not {"a shared object" if kind == 3 else "an object file"} (ELF type {e_type})'
            if wide:
                phoff, shoff = struct.unpack_from(e + 'QQ', head, 32)
                phentsize, phnum, shentsize, shnum = struct.unpack_from(e + 'HHHH', head, 54)
            else:
                phoff, shoff = struct.unpack_from(e + 'II', head, 28)
                phentsize, phnum, shentsize, shnum = struct.unpack_from(e + 'HHHH', head, 42)
            end = max(phoff + phnum * phentsize, shoff + shnum * shentsize)
            if end > size:
                return f'it is truncated: {size} bytes, but its header tables reach byte {end}'
            f.seek(phoff)
            table = f.read(phnum * phentsize)
            for i in range(phnum):
                if wide:
                    p_type, _, p_offset, _, _, p_filesz = struct.unpack_from(e + 'IIQQQQ', table,
                                                                             i * phentsize)
                else:
                    p_type, p_offset, _, _, p_filesz = struct.unpack_from(e + 'IIIII', table, i * phentsize)
                if p_type == 1 and p_offset + p_filesz > size:      # PT_LOAD
                    return (f'it is truncated: {size} bytes, but a segment it loads ends at byte '
                            f'{p_offset + p_filesz}')
    except (OSError, struct.error) as err:
        return f'it cannot be read ({err})'
    return None


def _load_problem(path, expected_hash):
    """Load ``path`` in a child Python (a crash stays there): what went wrong, or ``None``."""
    try:
        r = run_in_own_group([sys.executable, '-I', '-S', '-c', LOAD_CHECK, path],
                             timeout=LOAD_CHECK_TIMEOUT, with_children=False)
    except subprocess.TimeoutExpired:
        return f'loading it in a test process did not finish within {LOAD_CHECK_TIMEOUT} s'
    except OSError:
        return None            # no child process can be started: the ELF checks must do
    if r.returncode < 0:
        try:
            name = signal.Signals(-r.returncode).name
        except ValueError:
            name = f'signal {-r.returncode}'
        return f'loading it crashed a test process ({name})'
    if r.returncode:
        last = (r.stderr.strip().splitlines() or ['no message'])[-1]
        return f'it does not load: {last}'
    got = r.stdout.strip().rpartition('program_hash=')[2]
    if expected_hash and got != expected_hash:
        return (f'it reports program_hash {got}, but the source declares {expected_hash}: '
                'it is the build of another program')
    return None


def _trusted(so, digest):
    """The cached object was checked when it was recorded, is unchanged since
    (its SHA-256), and still looks whole."""
    try:
        with open(digest) as f:
            recorded = f.read().split()
        return (len(recorded) == 2 and recorded[1] == VERIFIED and sha256_file(so) == recorded[0]
                and elf_problem(so) is None)
    except OSError:
        return False


def discard_entry(path):
    """Remove the cached shared object ``path`` and its checksum, so that the
    next ``build_extension`` rebuilds it (its source is kept)."""
    root, name = os.path.split(path)
    key = name[:-len('.so')]
    try:
        with entry_lock(root, key):
            remove_if_present(os.path.join(root, key + '.sha256'))
            remove_if_present(path)
    except OSError as e:
        raise _cache_problem(root, f"its damaged entry {name} cannot be removed "
                             f"({_describe(e)})") from None


# -- running the compiler ------------------------------------------------------------------

OUT_OF_SPACE = ('No space left on device', 'Disk quota exceeded')


def _out_of_space_problem(toolchain, folder, problem='', **details):
    """``toolchain`` ran out of space in ``folder`` (or in its own temporary folder)."""
    reason = (f"{toolchain.name} ran out of disk space writing into {folder} (or its temporary "
              f"files in {tempfile.gettempdir()}){problem}")
    return CacheError(f"{reason}: {FREE_SPACE_HINT} (and TMPDIR for temporary files)", reason,
                      **details)


def _points_into(stderr, source_path):
    """An error message of the compiler names a line of ``source_path``."""
    name = re.escape(os.path.basename(source_path))
    return re.search(rf'^(?!In file included from).*{name}:\d+(:\d+)?:\s*(fatal )?error', stderr,
                     re.MULTILINE) is not None


def _run_compiler(toolchain, flags, source_path, out_path, timeout, include_dir=None,
                  default=True, expected_hash=None, objects=None):
    """Compile ``source_path`` into the shared object ``out_path`` and check
    the result (see the module's docstring); the command line. ``default``:
    the flags are the default ones, so a failure may point at the generated C
    rather than at the caller's flags. ``expected_hash``: the
    ``program_hash`` to check. With ``objects``, link those instead (the
    translation units of ``source_path``, compiled by ``_compile_object``),
    or, with ``objects=()``, compile ``source_path`` into the object
    ``out_path`` only."""
    include = os.path.abspath(python_include(include_dir))
    _check_headers(include, source_path)
    folder, cwd = os.path.dirname(source_path), None
    src, out, objs = source_path, out_path, list(objects or ())
    if toolchain.family == 'tcc' and any(c in folder for c in '"\\\n'):
        # tcc writes the source's path into a `#define` of its own without
        # escaping it: give it the file's name, and run it in the folder
        cwd, src, out = folder, os.path.basename(source_path), os.path.basename(out_path)
        objs = [os.path.relpath(o, folder) for o in objs]
    if objects is None:
        cmd = [toolchain.path, *toolchain.args, *flags, '-I', include, '-o', out, src, '-lm', '-lpthread']
    elif objs:
        cmd = [toolchain.path, *toolchain.args, *flags, '-o', out, *objs, '-lm', '-lpthread']
    else:
        cmd = [toolchain.path, *toolchain.args, *[f for f in flags if f != '-shared'], '-c', '-I', include,
               '-o', out, src]
    with terminate_cleanly():
        try:
            r = run_in_own_group(cmd, timeout=timeout, cwd=cwd)
            problem = None
            if r.returncode == 0 and os.path.exists(out_path) and objects == ():
                problem = elf_problem(out_path, kind=1)        # an object file: whole?
            elif r.returncode == 0 and os.path.exists(out_path):
                problem = elf_problem(out_path)
                if problem is None and include == os.path.abspath(sysconfig.get_paths()['include']):
                    problem = _load_problem(out_path, expected_hash)
        except subprocess.TimeoutExpired as e:
            remove_if_present(out_path)
            raise CompileTimeout(f"{toolchain.name} did not finish within {timeout:g} s "
                                 "(try tcc, a lower optimisation level, or a larger timeout: "
                                 "argument timeout=, or $MICROGRAD_CC_TIMEOUT)",
                                 cmd=cmd, stderr=e.stderr or '', source_path=source_path,
                                 cwd=cwd) from None
        except OSError as e:
            remove_if_present(out_path)
            raise CompilerNotFound(f"{toolchain.name} could not be run ({e}); {INSTALL_HINT}",
                                   cmd=cmd, source_path=source_path, cwd=cwd) from None
        except BaseException:
            remove_if_present(out_path)   # Ctrl-C, SIGTERM: the compiler is already dead
            raise
    stderr = r.stderr
    given = []                            # flags that came from the caller, not from us
    if toolchain.args:
        given.append(f"{' '.join(toolchain.args)} from the compiler command")
    if not default:
        given.append(f"flags={flags!r}, which replace the default flags entirely")
    details = dict(cmd=cmd, returncode=r.returncode, stderr=stderr or r.stdout,
                   source_path=source_path, cwd=cwd)
    if r.returncode != 0 or not os.path.exists(out_path):
        remove_if_present(out_path)
        if 'Python.h' in stderr and ('No such file' in stderr or 'not found' in stderr):
            raise HeadersNotFound(f"{toolchain.name} could not find the Python headers in {include}: "
                                  f"{HEADERS_HINT}", **details)
        if any(words in stderr for words in OUT_OF_SPACE):
            raise _out_of_space_problem(toolchain, folder, **details)
        if r.returncode == 0:
            why = (f" (it exited 0 but wrote no shared object: is {toolchain.path} a working C "
                   "compiler?)")
        elif given:
            why = (f" with the flags you gave ({'; '.join(given)}): check them, or leave them out "
                   "to use the defaults")
        elif _points_into(stderr, source_path):
            why = (". If the compiler works otherwise, the generated C is at fault: "
                   "please report it with the kept source")
        else:
            why = ": its own words are below"
        raise CompileError(f"{toolchain.name} failed to compile the generated module{why}", **details)
    if problem:
        remove_if_present(out_path)
        if disk_is_full(folder):
            raise _out_of_space_problem(toolchain, folder, f'; the shared object it wrote, exit '
                                        f'status 0, cannot be used: {problem}', **details)
        blame = ''
        if not given and 'undefined symbol' in problem:
            blame = (". If the compiler works otherwise, the generated C is at fault: please report "
                     "it with the kept source")
        raise CompileError(f"{toolchain.name} exited 0, but the shared object it wrote cannot be "
                           f"used: {problem}{blame}", **details)
    return cmd


# -- building ------------------------------------------------------------------------------

@dataclass
class Build:
    path: str          # the shared object to load
    cmd: list          # the command that built it (None when it came from the cache)
    cached: bool
    temporary: bool    # the caller removes ``path`` once it is loaded
    toolchain: Toolchain
    flags: list
    straight_flags: list = None     # the straight-line parts' flags, when not ``flags``
    straight_toolchain: Toolchain = None    # and their compiler, when not ``toolchain``

    def flags_text(self):
        """The flags, and the straight-line parts' level (or compiler) where it differs."""
        text = ' '.join(self.flags)
        if self.straight_toolchain is not None:
            return text + f' (straight-line parts {self.straight_toolchain.family})'
        return text + (f' (straight-line parts {self.straight_flags[0]})' if self.straight_flags else '')


def build_extension(source, toolchain, flags, timeout=DEFAULT_TIMEOUT, include_dir=None, progress=None,
                    straight_flags=None, straight_toolchain=None):
    """Compile ``source`` into a shared object, or reuse the cached one.

    On failure the C source is kept (its path is in the exception) and no
    shared object is left behind. ``flags`` is a list of str; ``timeout``
    is in seconds (``float('inf')``: no limit). A ``source`` with ``parts``
    (``compiler.codegen.Source``: its translation units) is built part by
    part, the parts in parallel, each part's object cached on its own (the
    loop kernels' part is the same for every program), then linked;
    ``progress(message)`` hears as each part is done. ``straight_flags``
    replace ``flags`` for the straight-line parts (``source.straight``),
    which ``straight_toolchain`` builds when given.
    """
    flags = check_flags(flags)
    straight = None
    if straight_flags and source.parts:
        straight = (straight_toolchain or toolchain, check_flags(straight_flags))
    timeout = check_timeout(timeout)
    default = _are_default_flags(toolchain, flags)
    marks = []
    if straight:
        marks = ['--straight', straight[0].path, straight[0].version, *straight[1]]
    key = build_key(source, toolchain, flags + marks, include_dir)
    args = (source, toolchain, flags, straight, timeout, include_dir, default, progress)
    cap = None if cache_disabled() else cache_max()    # a bad $MICROGRAD_CACHE_MAX is an error
    try:
        root = cache_dir()
        if root is not None:
            return _build_in_cache(*args, root, key, cap)
    except CacheError as e:
        if cache_chosen():
            raise
        _warn_fallback(e.reason)                   # the default cache is unusable
    return _build_in_temporary_folder(*args)


def _build(path, cmd, cached, temporary, toolchain, flags, straight):
    tc, straight_flags = straight or (None, None)
    return Build(path, cmd, cached, temporary, toolchain, flags, straight_flags,
                 tc if tc is not None and tc != toolchain else None)


def _link_flags(flags, straight):
    """tcc's objects do not say that their stack need not be executable: the linker must be told."""
    if straight and straight[0].family == 'tcc':
        return flags + ['-Wl,-z,noexecstack']
    return flags


def _build_in_cache(source, toolchain, flags, straight, timeout, include_dir, default, progress, root,
                    key, cap):
    so, digest = os.path.join(root, key + '.so'), os.path.join(root, key + '.sha256')
    if _trusted(so, digest):
        touch(so)
        return _build(so, None, True, False, toolchain, flags, straight)
    try:
        with entry_lock(root, key):       # one process builds, the others wait and reuse
            if _trusted(so, digest):
                touch(so)
                return _build(so, None, True, False, toolchain, flags, straight)
            sweep_temporaries(root, busy={key})
            src = os.path.join(root, key + '.c')
            write_atomically(src, source)
            tmp = os.path.join(root, f'.tmp-{key}-{os.getpid()}.so')
            try:
                objects = _objects(source, toolchain, flags, straight, timeout, include_dir, default,
                                   root, True, progress)
                cmd = _run_compiler(toolchain, _link_flags(flags, straight), src, tmp, timeout, include_dir,
                                    default, program_hash(source), objects)
                write_atomically(digest, f'{sha256_file(tmp)} {VERIFIED}\n')
                os.replace(tmp, so)
            finally:
                remove_if_present(tmp)
                evict(root, cap, keep={key})
    except OSError as e:
        full = is_out_of_space(e)
        raise _cache_problem(root, f"{'the disk is full' if full else _describe(e)} "
                             f"({e.filename or root})", full) from e
    return _build(so, cmd, False, False, toolchain, flags, straight)


def _build_in_temporary_folder(source, toolchain, flags, straight, timeout, include_dir, default,
                               progress):
    folder = None
    try:
        folder = tempfile.mkdtemp(prefix='micrograd-build-')
        src = os.path.join(folder, 'nn.c')
        with open(src, 'w') as f:
            f.write(source)
    except OSError as e:
        if folder:
            shutil.rmtree(folder, ignore_errors=True)
        reason = f"no temporary build folder can be made in {tempfile.gettempdir()}: {_describe(e)}"
        raise CacheError(f"{reason}; set TMPDIR to a writable folder, or MICROGRAD_CACHE_DIR to a "
                         "build cache folder", reason) from None
    so = os.path.join(folder, 'nn.so')
    objects = _objects(source, toolchain, flags, straight, timeout, include_dir, default, folder, False,
                       progress)
    cmd = _run_compiler(toolchain, _link_flags(flags, straight), src, so, timeout, include_dir, default,
                        program_hash(source), objects)
    return _build(so, cmd, False, True, toolchain, flags, straight)


def _objects(source, toolchain, flags, straight, timeout, include_dir, default, folder, cached,
             progress=None):
    """The object files of ``source``'s translation units, compiled in
    parallel into ``folder`` (None for a source of one unit). ``cached``:
    each is kept as ``KEY.o`` under a key of its own, and reused."""
    parts = getattr(source, 'parts', ())
    if len(parts) <= 1:
        return None
    straight_parts = getattr(source, 'straight', ())
    jobs = []
    for name, text in parts:
        tc, part_flags = straight if straight and name in straight_parts else (toolchain, flags)
        jobs.append((name, text, tc, part_flags, build_key(text, tc, ['-c', *part_flags], include_dir)))
    with concurrent.futures.ThreadPoolExecutor(max(1, min(len(jobs), _cores()))) as pool:
        futures = [pool.submit(_compile_object, name, text, key, tc, part_flags, timeout, include_dir,
                               default, folder, cached) for name, text, tc, part_flags, key in jobs]
        told = 0
        for done, _ in enumerate(concurrent.futures.as_completed(futures), 1):
            if progress and done * 4 // len(futures) > told:     # at each quarter
                told = done * 4 // len(futures)
                progress(f"compiled {done} of {len(futures)} parts")
        return [f.result() for f in futures]


def _compile_object(name, text, key, toolchain, flags, timeout, include_dir, default, folder, cached):
    """One translation unit's object file (reused from the cache when it is there and whole)."""
    if not cached:
        src = os.path.join(folder, f'{name}.c')
        with open(src, 'w') as f:
            f.write(text)
        obj = os.path.join(folder, f'{name}.o')
        _run_compiler(toolchain, flags, src, obj, timeout, include_dir, default, objects=())
        return obj
    obj, digest = os.path.join(folder, key + '.o'), os.path.join(folder, key + '.sha256')
    if _trusted_object(obj, digest):
        touch(obj)
        return obj
    with entry_lock(folder, key):
        if _trusted_object(obj, digest):
            touch(obj)
            return obj
        src = os.path.join(folder, key + '.c')
        write_atomically(src, text)
        tmp = os.path.join(folder, f'.tmp-{key}-{os.getpid()}-{threading.get_ident()}.o')
        try:
            _run_compiler(toolchain, flags, src, tmp, timeout, include_dir, default, objects=())
            write_atomically(digest, f'{sha256_file(tmp)} {VERIFIED}\n')
            os.replace(tmp, obj)
        finally:
            remove_if_present(tmp)
    return obj


def _trusted_object(obj, digest):
    """A cached object file is unchanged since it was compiled (its SHA-256)."""
    try:
        with open(digest) as f:
            recorded = f.read().split()
        return len(recorded) == 2 and recorded[1] == VERIFIED and sha256_file(obj) == recorded[0]
    except OSError:
        return False
