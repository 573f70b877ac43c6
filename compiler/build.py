"""Build C source into a CPython extension, with an on-disk cache.

The compiler is chosen by argument (``'tcc'``, ``'clang'``, ``'gcc'`` or a
path), else ``$CC``, else the first of clang, gcc, tcc, cc found on ``PATH``.
Flags keep IEEE semantics: no fast-math, no contraction into FMA.

Cache: ``$MICROGRAD_CACHE_DIR``, else ``$XDG_CACHE_HOME/micrograd-compiler``,
else ``~/.cache/micrograd-compiler``; ``MICROGRAD_CACHE=0`` builds in a
temporary folder instead. Entries are keyed by a hash of everything that
decides the binary, written under a file lock to a temporary name and renamed
into place, and checked against a recorded SHA-256 before they are used.
"""
import fcntl
import functools
import hashlib
import os
import shutil
import subprocess
import sysconfig
import tempfile
from dataclasses import dataclass

from compiler.codegen import GENERATOR_VERSION

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
    return flags + ['-march=native'] if native else flags


def _python_include():
    include = sysconfig.get_paths()['include']
    if not os.path.exists(os.path.join(include, 'Python.h')):
        raise HeadersNotFound(f"Python.h is not in {include}: install the Python development headers "
                              "(e.g. 'apt-get install python3-dev')")
    return include


def cache_dir():
    """The build cache folder, or ``None`` when ``MICROGRAD_CACHE=0`` disables it."""
    if os.environ.get('MICROGRAD_CACHE', '1') in ('0', 'false', 'no', 'off'):
        return None
    root = os.environ.get('MICROGRAD_CACHE_DIR')
    if not root:
        base = os.environ.get('XDG_CACHE_HOME') or os.path.join(os.path.expanduser('~'), '.cache')
        root = os.path.join(base, 'micrograd-compiler')
    os.makedirs(root, mode=0o700, exist_ok=True)
    return root


def build_key(source, toolchain, flags):
    h = hashlib.sha256()
    for part in (GENERATOR_VERSION, toolchain.path, toolchain.version, ' '.join(flags),
                 sysconfig.get_config_var('EXT_SUFFIX') or '', source):
        h.update(part.encode())
        h.update(b'\0')
    return h.hexdigest()[:32]


def _sha256_file(path):
    with open(path, 'rb') as f:
        return hashlib.file_digest(f, 'sha256').hexdigest()


def _write_atomic(path, data):
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix='.tmp-')
    try:
        with os.fdopen(fd, 'w') as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        _remove(tmp)
        raise


def _remove(path):
    try:
        os.remove(path)
    except FileNotFoundError:
        pass


def _run_compiler(toolchain, flags, source_path, out_path, timeout):
    cmd = [toolchain.path, *flags, '-I', _python_include(), '-o', out_path, source_path, '-lm']
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        _remove(out_path)
        stderr = e.stderr.decode(errors='replace') if isinstance(e.stderr, bytes) else (e.stderr or '')
        raise CompileTimeout(f"{toolchain.name} did not finish within {timeout:g} s "
                             "(try tcc, a lower optimisation level, or a larger timeout)",
                             cmd=cmd, stderr=stderr, source_path=source_path) from None
    if r.returncode != 0 or not os.path.exists(out_path):
        _remove(out_path)
        raise CompileError(f"{toolchain.name} failed to compile the generated module",
                           cmd=cmd, returncode=r.returncode, stderr=r.stderr, source_path=source_path)
    return cmd


@dataclass
class Build:
    path: str          # the shared object to load
    cmd: list          # the command that built it (None when it came from the cache)
    cached: bool
    temporary: bool    # the caller removes ``path`` once it is loaded
    toolchain: Toolchain
    flags: list


def build_extension(source, toolchain, flags, timeout=DEFAULT_TIMEOUT):
    """Compile ``source`` into a shared object, or reuse the cached one."""
    key = build_key(source, toolchain, flags)
    root = cache_dir()
    if root is None:
        tmpdir = tempfile.mkdtemp(prefix='micrograd-build-')
        src = os.path.join(tmpdir, 'nn.c')
        with open(src, 'w') as f:
            f.write(source)
        so = os.path.join(tmpdir, 'nn.so')
        cmd = _run_compiler(toolchain, flags, src, so, timeout)
        return Build(so, cmd, False, True, toolchain, flags)

    so, digest = os.path.join(root, key + '.so'), os.path.join(root, key + '.sha256')
    if _verified(so, digest):
        return Build(so, None, True, False, toolchain, flags)
    with open(os.path.join(root, key + '.lock'), 'w') as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)   # one process builds, the others wait and reuse
        if _verified(so, digest):
            return Build(so, None, True, False, toolchain, flags)
        src = os.path.join(root, key + '.c')
        _write_atomic(src, source)
        tmp = os.path.join(root, f'.tmp-{key}-{os.getpid()}.so')
        try:
            cmd = _run_compiler(toolchain, flags, src, tmp, timeout)
            _write_atomic(digest, _sha256_file(tmp))
            os.replace(tmp, so)
        finally:
            _remove(tmp)
    return Build(so, cmd, False, False, toolchain, flags)


def _verified(so, digest):
    """The cached object exists and is the one that was written (not truncated or altered)."""
    try:
        with open(digest) as f:
            expected = f.read().strip()
        return _sha256_file(so) == expected
    except OSError:
        return False
