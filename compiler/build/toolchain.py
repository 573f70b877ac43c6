"""Which C compiler: the ``cc`` argument (``'tcc'``, ``'clang'``, ``'gcc'``, a
path, or a command with leading flags such as ``'gcc -std=c99'``), else
``$CC`` (split as a shell would, as make does: the first word is the
compiler, the rest lead its flags), else the first of clang, gcc, tcc, cc
found on ``PATH``. A program counts as clang, gcc or tcc only if
preprocessing a probe with it expands that compiler's predefined macros
(``__clang__``, ``__GNUC__``, ``__TINYC__``): version texts are not evidence
(``cat --version`` names the Free Software Foundation).

The Python headers are those of the running interpreter, or the folder
named by ``$MICROGRAD_PYTHON_INCLUDE`` (or the ``include_dir`` argument).

An identity found is kept in the build cache's folder with the program's
``stat`` (``compiler.build.cache`` installs that memory: ``remember_in``):
a later process reads it there instead of probing again.

Also what ``-march=native`` means to a compiler here (for the cache key).
"""
import functools
import os
import platform
import re
import shlex
import shutil
import subprocess
import sysconfig
from dataclasses import dataclass

from compiler.build.errors import HEADERS_HINT, INSTALL_HINT, CompilerNotFound, HeadersNotFound

PREFERRED = ('clang', 'gcc', 'tcc', 'cc')

# sysconfig fills its table on first use, and not thread-safely: a thread
# that asks while another fills it reads a half-filled table (EXT_SUFFIX
# None: a cache key that misses; paths not there). Builds run in threads (the
# loop kernels are built ahead while the C walk is built): fill it at import.
sysconfig.get_config_vars()


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
    from the macros it predefines when it preprocesses ``IDENTIFY_PROBE``;
    as an earlier process found it, where the program is unchanged since."""
    stamp = _stamp(path)
    known = _remembered(path, args, stamp)
    if known is not None:
        return known
    toolchain = _probe(path, args)
    _remember(toolchain, stamp)
    return toolchain


def _probe(path, args):
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


# Identifying a compiler takes two processes (15-20 ms each on the AMD EPYC
# VM), and the size-aware choice identifies clang, gcc and tcc: 0.07 s of
# the 0.16 s a cached compile() of 784-50-10 took in a fresh process. So a
# found identity is kept with the program's stat (device, inode, size,
# mtime, ctime, as ccache's compiler_check=mtime): a program replaced,
# rebuilt or touched is probed again. The build cache keeps them in its
# folder (compiler.build.cache installs ``recall`` and ``keep``); without
# it, every process probes.
_memory = None


def remember_in(recall, keep):
    """Identities found are kept by ``keep(path, args, stamp, fields)`` and
    read back by ``recall(path, args, stamp)`` (a dict of ``fields``, or None)."""
    global _memory
    _memory = (recall, keep)


def _stamp(path):
    try:
        st = os.stat(path)
    except OSError:
        return None
    return [st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]


def _remembered(path, args, stamp):
    """The ``Toolchain`` an earlier process found for ``path`` and ``args``
    while the program had ``stamp``, or None."""
    known = _memory[0](path, list(args), stamp) if _memory and stamp else None
    if not isinstance(known, dict) or known.get('family') not in ('clang', 'gcc', 'tcc') \
            or not isinstance(known.get('version'), str):
        return None
    return Toolchain(path, known['family'], known['version'], tuple(args))


def _remember(toolchain, stamp):
    if _memory and stamp:
        _memory[1](toolchain.path, list(toolchain.args), stamp,
                   {'family': toolchain.family, 'version': toolchain.version})


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


def wants_native(flags):
    return any(f.split('=', 1)[0] in ('-march', '-mcpu', '-mtune') and f.endswith('=native')
               for f in flags)


@functools.lru_cache(maxsize=None)
def native_target(toolchain):
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
    return f'platform: {platform.machine()} {platform.processor()}'


# -- the Python headers ------------------------------------------------------------------

def python_include(include_dir=None):
    """The folder holding ``Python.h``: ``include_dir``, ``$MICROGRAD_PYTHON_INCLUDE``,
    or the running interpreter's."""
    return include_dir or os.environ.get('MICROGRAD_PYTHON_INCLUDE') or sysconfig.get_paths()['include']


def check_headers(include, source_path):
    if not os.path.isfile(os.path.join(include, 'Python.h')):
        raise HeadersNotFound(f"Python.h is not in {include}: {HEADERS_HINT}", source_path=source_path)
