"""Build C source into a CPython extension, with an on-disk cache.

The compiler is chosen by argument (``'tcc'``, ``'clang'``, ``'gcc'`` or a
path), else ``$CC``, else the first of clang, gcc, tcc, cc found on ``PATH``.
Flags keep IEEE semantics: no fast-math, no contraction into FMA.

The Python headers are those of the running interpreter, or the folder named
by ``$MICROGRAD_PYTHON_INCLUDE`` (or the ``include_dir`` argument).

Cache: ``$MICROGRAD_CACHE_DIR``, else ``$XDG_CACHE_HOME/micrograd-compiler``,
else ``~/.cache/micrograd-compiler``; ``MICROGRAD_CACHE=0`` builds in a
temporary folder instead. A shared object that someone else can replace would
run as the user, so the folder is the user's alone: it is created with mode
0o700; the default folder, if it exists with wider permissions, is narrowed
to 0o700; a ``$MICROGRAD_CACHE_DIR`` is left as it is, but refused if another
user owns it or it is writable by group or others. Entries are keyed by a hash of
everything that decides the binary, written under a file lock to a temporary
name and renamed into place, and checked against a recorded SHA-256 before
they are used; a failed build leaves no shared object and no checksum.
"""
import fcntl
import functools
import hashlib
import os
import shutil
import stat
import subprocess
import sysconfig
import tempfile
from dataclasses import dataclass

from compiler.constants import ROW_BLOCK
from compiler.files import (cache_root, kill_process_group, remove_if_present, sha256_file,
                            write_atomically)

PREFERRED = ('clang', 'gcc', 'tcc', 'cc')
INSTALL_HINT = "install one, e.g. 'apt-get install clang tcc' or 'apt-get install gcc'"
DEFAULT_TIMEOUT = float(os.environ.get('MICROGRAD_CC_TIMEOUT', 600))


class BuildError(RuntimeError):
    """A build failed; ``cmd``, ``returncode``, ``stderr`` and ``source_path`` say how."""

    def __init__(self, message, cmd=None, returncode=None, stderr='', source_path=None):
        self.cmd, self.returncode, self.stderr, self.source_path = cmd, returncode, stderr, source_path
        details = []
        if cmd:
            details.append('command: ' + ' '.join(cmd))
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


@dataclass(frozen=True)
class Toolchain:
    path: str
    family: str     # 'clang', 'gcc' or 'tcc'
    version: str    # first line of the compiler's own version text

    @property
    def name(self):
        return f'{self.family} ({os.path.basename(self.path)})'


@functools.lru_cache(maxsize=None)
def _identify(path):
    for flag in ('--version', '-v'):
        try:
            r = subprocess.run([path, flag], capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            continue
        text = (r.stdout + r.stderr).strip()
        low = text.lower()
        if 'tcc' in low or 'tiny c' in low:
            return Toolchain(path, 'tcc', text.splitlines()[0])
        if r.returncode == 0 and 'clang' in low:
            return Toolchain(path, 'clang', text.splitlines()[0])
        if r.returncode == 0 and ('gcc' in low or 'free software foundation' in low):
            return Toolchain(path, 'gcc', text.splitlines()[0])
    raise CompilerNotFound(f"{path} does not identify itself as clang, gcc or tcc; {INSTALL_HINT}")


def find_compiler(cc=None):
    """The ``Toolchain`` for ``cc`` (a name or a path), ``$CC``, or the best available."""
    wanted = cc or os.environ.get('CC')
    candidates = [wanted] if wanted else list(PREFERRED)
    for name in candidates:
        path = shutil.which(name)
        if path:
            return _identify(os.path.realpath(path))
    raise CompilerNotFound(f"no C compiler found (tried {', '.join(candidates)}); {INSTALL_HINT}")


# The level that trains fastest with each compiler (benchmarks/bench_mnist.py):
# gcc 12 vectorizes loops only at -O3.
DEFAULT_OPT = {'clang': '-O2', 'gcc': '-O3'}


def default_flags(toolchain, opt=None, native=False):
    """Flags that keep IEEE double semantics: no fast-math, no FMA contraction.

    ``native`` adds ``-march=native`` (opt-in: the build then runs only on
    machines like this one).
    """
    if toolchain.family == 'tcc':
        return ['-shared', '-fPIC']
    flags = [opt or DEFAULT_OPT[toolchain.family], '-shared', '-fPIC',
             '-ffp-contract=off', '-fno-fast-math', '-w']
    if toolchain.family == 'gcc':
        # gcc keeps a loop's array of running sums in registers only once it
        # has unrolled the loop over it, by default up to 16 iterations; the
        # vector ops' loops keep ROW_BLOCK
        flags += [f'--param=max-completely-peel-times={ROW_BLOCK}',
                  '--param=max-completely-peeled-insns=2000']
    return flags + ['-march=native'] if native else flags


HEADERS_HINT = "install the Python development headers (e.g. 'apt-get install python3-dev')"


def python_include(include_dir=None):
    """The folder holding ``Python.h``: ``include_dir``, ``$MICROGRAD_PYTHON_INCLUDE``,
    or the running interpreter's."""
    return include_dir or os.environ.get('MICROGRAD_PYTHON_INCLUDE') or sysconfig.get_paths()['include']


def _check_headers(include, source_path):
    if not os.path.isfile(os.path.join(include, 'Python.h')):
        raise HeadersNotFound(f"Python.h is not in {include}: {HEADERS_HINT}", source_path=source_path)


def cache_dir():
    """The build cache folder, or ``None`` when ``MICROGRAD_CACHE=0`` disables it."""
    if os.environ.get('MICROGRAD_CACHE', '1') in ('0', 'false', 'no', 'off'):
        return None
    default = not os.environ.get('MICROGRAD_CACHE_DIR')
    root = cache_root()
    os.makedirs(root, mode=0o700, exist_ok=True)
    _check_private(root, narrow=default)
    return root


def _check_private(root, narrow):
    """Refuse a cache folder others can write to; ``narrow`` it to 0o700 instead if it is ours."""
    st = os.stat(root)
    mode = stat.S_IMODE(st.st_mode)
    if st.st_uid != os.getuid():
        raise BuildError(f"the build cache folder {root} belongs to uid {st.st_uid}, not to this user "
                         f"(uid {os.getuid()}): set MICROGRAD_CACHE_DIR to a folder of your own")
    if narrow and mode != 0o700:
        os.chmod(root, 0o700)
    elif mode & 0o022:
        raise BuildError(f"the build cache folder {root} is writable by others (mode {mode:#o}): "
                         f"run 'chmod go-w {root}' or set MICROGRAD_CACHE_DIR to a private folder")


def build_key(source, toolchain, flags, include_dir=None):
    """The cache key: a hash of the compiler's path and version, each flag, the
    Python headers' folder and extension suffix, and the source (which names
    the generator's version). Each part is length-prefixed, so no two lists of
    parts collide."""
    h = hashlib.sha256()
    for part in (toolchain.path, toolchain.version, *flags, '--',
                 python_include(include_dir), sysconfig.get_config_var('EXT_SUFFIX') or '', source):
        data = part.encode('utf-8', 'surrogateescape')
        h.update(len(data).to_bytes(8, 'little'))
        h.update(data)
    return h.hexdigest()[:32]


def _run_compiler(toolchain, flags, source_path, out_path, timeout, include_dir=None):
    include = python_include(include_dir)
    _check_headers(include, source_path)
    cmd = [toolchain.path, *flags, '-I', include, '-o', out_path, source_path, '-lm']
    # A session of its own, so that a timeout kills the whole process group:
    # the driver's children (cc1, as, ld) would otherwise keep the pipes open.
    try:
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, errors='replace',
                                start_new_session=True)
    except OSError as e:
        raise CompilerNotFound(f"{toolchain.name} could not be run ({e}); {INSTALL_HINT}",
                               cmd=cmd, source_path=source_path) from None
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_process_group(proc)
        stdout, stderr = proc.communicate()
        remove_if_present(out_path)
        raise CompileTimeout(f"{toolchain.name} did not finish within {timeout:g} s "
                             "(try tcc, a lower optimisation level, or a larger timeout: "
                             "argument timeout=, or $MICROGRAD_CC_TIMEOUT)",
                             cmd=cmd, returncode=proc.returncode, stderr=stderr,
                             source_path=source_path) from None
    except BaseException:
        kill_process_group(proc)     # KeyboardInterrupt: leave no compiler running
        proc.wait()
        remove_if_present(out_path)
        raise
    if proc.returncode != 0 or not os.path.exists(out_path):
        remove_if_present(out_path)
        if 'Python.h' in stderr and ('No such file' in stderr or 'not found' in stderr):
            raise HeadersNotFound(f"{toolchain.name} could not find the Python headers in {include}: "
                                  f"{HEADERS_HINT}", cmd=cmd, returncode=proc.returncode,
                                  stderr=stderr, source_path=source_path)
        raise CompileError(f"{toolchain.name} failed to compile the generated module"
                           + ("" if proc.returncode else " (it exited 0 but wrote no shared object)")
                           + ". If the compiler works otherwise, the generated C is at fault: "
                           "please report it with the kept source",
                           cmd=cmd, returncode=proc.returncode, stderr=stderr or stdout,
                           source_path=source_path)
    return cmd


@dataclass
class Build:
    path: str          # the shared object to load
    cmd: list          # the command that built it (None when it came from the cache)
    cached: bool
    temporary: bool    # the caller removes ``path`` once it is loaded
    toolchain: Toolchain
    flags: list


def build_extension(source, toolchain, flags, timeout=DEFAULT_TIMEOUT, include_dir=None):
    """Compile ``source`` into a shared object, or reuse the cached one.

    On failure the C source is kept (its path is in the exception) and no
    shared object is left behind.
    """
    key = build_key(source, toolchain, flags, include_dir)
    root = cache_dir()
    if root is None:
        tmpdir = tempfile.mkdtemp(prefix='micrograd-build-')
        src = os.path.join(tmpdir, 'nn.c')
        with open(src, 'w') as f:
            f.write(source)
        so = os.path.join(tmpdir, 'nn.so')
        cmd = _run_compiler(toolchain, flags, src, so, timeout, include_dir)
        return Build(so, cmd, False, True, toolchain, flags)

    so, digest = os.path.join(root, key + '.so'), os.path.join(root, key + '.sha256')
    if _verified(so, digest):
        return Build(so, None, True, False, toolchain, flags)
    with open(os.path.join(root, key + '.lock'), 'w') as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)   # one process builds, the others wait and reuse
        if _verified(so, digest):
            return Build(so, None, True, False, toolchain, flags)
        src = os.path.join(root, key + '.c')
        write_atomically(src, source)
        tmp = os.path.join(root, f'.tmp-{key}-{os.getpid()}.so')
        try:
            cmd = _run_compiler(toolchain, flags, src, tmp, timeout, include_dir)
            write_atomically(digest, sha256_file(tmp))
            os.replace(tmp, so)
        finally:
            remove_if_present(tmp)
    return Build(so, cmd, False, False, toolchain, flags)


def _verified(so, digest):
    """The cached object exists and is the one that was written (not truncated or altered)."""
    try:
        with open(digest) as f:
            expected = f.read().strip()
        return sha256_file(so) == expected
    except OSError:
        return False
