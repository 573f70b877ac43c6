"""Files and processes, done once for the whole project: atomic writes, file
hashes, the cache folder, killing a process group."""
import contextlib
import hashlib
import os
import signal
import tempfile

CACHE_FOLDER_NAME = 'micrograd-compiler'


def default_cache_root():
    """``$XDG_CACHE_HOME/micrograd-compiler``, else ``~/.cache/micrograd-compiler``."""
    base = os.environ.get('XDG_CACHE_HOME') or os.path.join(os.path.expanduser('~'), '.cache')
    return os.path.join(base, CACHE_FOLDER_NAME)


def cache_root():
    """The folder for builds and downloads: ``$MICROGRAD_CACHE_DIR`` if set, else
    ``default_cache_root()``. Not created here."""
    return os.environ.get('MICROGRAD_CACHE_DIR') or default_cache_root()


def sha256_file(path):
    """The hex SHA-256 of the file at ``path``."""
    with open(path, 'rb') as f:
        return hashlib.file_digest(f, 'sha256').hexdigest()


@contextlib.contextmanager
def atomic_write(path, mode='wb'):
    """A file object whose contents replace ``path`` only when the block ends
    without an exception: written to a temporary file in the same folder,
    then renamed over ``path`` (atomic within a folder). A crash, a full disk
    or Ctrl-C mid-write never leaves a partial file where an earlier good one
    was, and nothing is left behind on failure."""
    folder = os.path.dirname(os.path.abspath(path))
    fd, temp = tempfile.mkstemp(dir=folder, prefix=f'.{os.path.basename(path)}.', suffix='.tmp')
    try:
        with os.fdopen(fd, mode) as f:
            yield f
        os.replace(temp, path)
    except BaseException:
        remove_if_present(temp)
        raise


def write_atomically(path, text):
    """``text`` (str) into ``path`` through ``atomic_write``."""
    with atomic_write(path, 'w') as f:
        f.write(text)


def remove_if_present(path):
    try:
        os.remove(path)
    except FileNotFoundError:
        pass


def kill_process_group(proc):
    """SIGKILL the process group led by ``proc`` (started with
    ``start_new_session=True``): a compiler driver's children (cc1, as, ld)
    go with it."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        proc.kill()
