"""Files, done once for the whole project: atomic writes (a crash never
leaves a half-written file where a good one was) and file hashes. The build
cache lives in ``compiler/build/cache.py``, running and killing processes in
``compiler/build/process.py``.
"""
import contextlib
import hashlib
import os
import tempfile


def sha256_file(path):
    """The hex SHA-256 of the file at ``path``."""
    with open(path, 'rb') as f:
        return hashlib.file_digest(f, 'sha256').hexdigest()


PROC_STATUS = '/proc/self/status'      # Linux 4.7+ shows the umask there


def current_umask():
    """The process's umask, read from ``/proc/self/status``. Elsewhere it is
    read the only portable way, by setting it with ``os.umask`` and setting
    it back: a file another thread creates in between gets umask 022's mode."""
    try:
        with open(PROC_STATUS) as f:
            for line in f:
                if line.startswith('Umask:'):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


@contextlib.contextmanager
def atomic_write(path, mode='wb', private=False):
    """A file object whose contents replace ``path`` only when the block ends
    without an exception: written to a temporary file in the same folder,
    then renamed over ``path`` (atomic within a folder). A crash, a full disk
    or Ctrl-C mid-write never leaves a partial file where an earlier good one
    was, and nothing is left behind on failure.

    The file ends up as a plain ``open(path, 'w')`` would leave it, not as
    ``mkstemp`` makes it: with mode ``0o666 & ~umask`` (0644 under the usual
    umask 022) instead of 0600, and when ``path`` is a symlink the link
    stays and its target gets the contents (the temporary file goes beside
    the target, so the rename stays within one folder). ``private=True``
    keeps ``mkstemp``'s 0600, for files only their owner should read."""
    target = os.path.realpath(path)
    folder = os.path.dirname(target)
    fd, temp = tempfile.mkstemp(dir=folder, prefix=f'.{os.path.basename(target)}.', suffix='.tmp')
    try:
        with os.fdopen(fd, mode) as f:
            if not private:
                # A file system without modes (vfat) may refuse: the file
                # then keeps mkstemp's narrower mode, which is safe.
                with contextlib.suppress(OSError):
                    os.fchmod(f.fileno(), 0o666 & ~current_umask())
            yield f
        os.replace(temp, target)
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
