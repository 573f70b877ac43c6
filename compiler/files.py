"""Files and processes, done once for the whole project: atomic writes, file
hashes, the cache folder (its entries, their temporaries, the size cap),
running a program in a process group that ends with this process, and
killing that group.

The build cache folder holds one *entry* per build key (32 hex digits):
``KEY.so`` (the shared object), ``KEY.sha256`` (its checksum, written once
the object passed its checks), ``KEY.c`` (the source; after a failed build it
is all that is left) and ``KEY.lock`` (held with ``flock`` while ``KEY`` is
being built). A build's temporaries (``.tmp-KEY-PID.so``,
``.KEY.c.XXXX.tmp``...) carry its key too, and exist only while their
builder holds ``KEY.lock``: a temporary whose lock is free belongs to a dead
build. Anything else in the folder (``mnist/`` downloads) is not an entry and
is never touched here.
"""
import contextlib
import ctypes
import errno
import fcntl
import functools
import hashlib
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass

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


def touch(path):
    """Mark ``path`` as just used (its mtime and atime are now): the cache's
    least-recently-used order. A read-only cache is used without marking."""
    try:
        os.utime(path)
    except OSError:
        pass


# -- the cache folder: entries, temporaries, the size cap -------------------------------

KEY = re.compile(r'[0-9a-f]{32}')
ENTRY_FILE = re.compile(r'([0-9a-f]{32})\.(so|o|sha256|c|lock)')
TEMPORARY = re.compile(r'\..*?([0-9a-f]{32})')
DEFAULT_CACHE_MAX = 1 << 30          # 1 GiB
SIZE_UNITS = {'': 1, 'k': 1 << 10, 'm': 1 << 20, 'g': 1 << 30, 't': 1 << 40}


def parse_size(text):
    """Bytes from ``'123'``, ``'500M'``, ``'2G'``, ``'1.5GiB'``, ``'64kb'``
    (units are powers of 1024, any case); ``ValueError`` otherwise."""
    m = re.fullmatch(r'\s*(\d+(?:\.\d*)?|\.\d+)\s*([kmgt]?)(?:i?b)?\s*', str(text), re.IGNORECASE)
    if not m:
        raise ValueError(f"{text!r} is not a size (a number of bytes, or with K, M, G or T: '500M', '2G')")
    return int(float(m.group(1)) * SIZE_UNITS[m.group(2).lower()])


def format_size(n):
    """``n`` bytes for people: ``512 B``, ``1.5 KiB``, ``500.0 MiB``, ``2.0 GiB``."""
    for unit in ('B', 'KiB', 'MiB', 'GiB'):
        if n < 1024 or unit == 'GiB':
            return f'{n} B' if unit == 'B' else f'{n:.1f} {unit}'
        n /= 1024


@dataclass
class CacheEntry:
    key: str
    files: list         # full paths of its files (not temporaries)
    size: int           # bytes, all its files together
    last_used: float    # mtime of its shared object (touched on every use), else of its newest file
    built: bool         # it has a shared object; a failed build's entry holds only its source


def cache_entries(root):
    """The entries of the cache folder ``root``, least recently used first;
    failed builds' leftovers (a source, no shared object) before any built one."""
    groups = {}
    try:
        names = os.listdir(root)
    except (FileNotFoundError, NotADirectoryError):
        return []
    for name in names:
        m = ENTRY_FILE.fullmatch(name)
        if not m:
            continue
        try:
            st = os.stat(os.path.join(root, name))
        except OSError:
            continue
        groups.setdefault(m.group(1), {})[m.group(2)] = (os.path.join(root, name), st)
    entries = []
    for key, parts in groups.items():
        built = 'so' in parts or 'o' in parts      # a module, or one translation unit's object
        done = parts.get('so') or parts.get('o')
        last_used = done[1].st_mtime if built else max(st.st_mtime for _, st in parts.values())
        entries.append(CacheEntry(key, [p for p, _ in parts.values()],
                                  sum(st.st_size for _, st in parts.values()), last_used, built))
    entries.sort(key=lambda e: (e.built, e.last_used))
    return entries


@contextlib.contextmanager
def entry_lock(root, key, wait=True):
    """Hold ``KEY.lock`` (created if missing). With ``wait=False`` the block
    gets ``False`` at once, instead of waiting, when someone else holds it."""
    with open(os.path.join(root, key + '.lock'), 'a') as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        except BlockingIOError:
            yield False
            return
        yield True


def _lock_is_free(root, key):
    """No one holds ``KEY.lock`` (or it does not exist): nobody is building ``KEY``.
    Returns an open file holding the lock (close it to release), ``True`` if
    there is no lock file, or ``None`` if the lock is held."""
    try:
        fd = os.open(os.path.join(root, key + '.lock'), os.O_RDWR)
    except FileNotFoundError:
        return True
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return os.fdopen(fd)


def sweep_temporaries(root, busy=()):
    """Remove the temporaries of dead builds (killed, or their machine
    crashed): those whose key's lock nobody holds. Keys in ``busy`` (locked by
    this process) are skipped. Returns the paths removed."""
    removed = []
    try:
        names = os.listdir(root)
    except OSError:
        return removed
    for name in names:
        m = TEMPORARY.match(name)
        if not m or m.group(1) in busy:
            continue
        held = _lock_is_free(root, m.group(1))
        if held is None:
            continue
        try:
            os.remove(os.path.join(root, name))
            removed.append(os.path.join(root, name))
        except OSError:
            pass
        finally:
            if held is not True:
                held.close()
    return removed


def remove_entry(root, entry):
    """Remove every file of ``entry`` unless someone is building it; ``True`` if removed.
    The lock file goes last, while it is held."""
    held = _lock_is_free(root, entry.key)
    if held is None:
        return False
    try:
        for path in sorted(entry.files, key=lambda p: p.endswith('.lock')):
            with contextlib.suppress(OSError):
                os.remove(path)
    finally:
        if held is not True:
            held.close()
    return True


def evict(root, cap, keep=()):
    """Remove least-recently-used entries (failed builds' sources first) until
    the folder's entries total at most ``cap`` bytes; never those in ``keep``
    nor one being built. Returns the keys removed. Best effort: a file that
    cannot be removed is left."""
    try:
        entries = cache_entries(root)
    except OSError:
        return []
    total = sum(e.size for e in entries)
    removed = []
    for entry in entries:
        if total <= cap:
            break
        if entry.key in keep:
            continue
        if remove_entry(root, entry):
            total -= entry.size
            removed.append(entry.key)
    return removed


def clear_cache(root):
    """Remove every entry and dead temporary of the cache folder ``root``.
    Returns (entries removed, bytes freed, entries left because they are being built)."""
    sweep_temporaries(root)
    removed = freed = busy = 0
    for entry in cache_entries(root):
        if remove_entry(root, entry):
            removed, freed = removed + 1, freed + entry.size
        else:
            busy += 1
    return removed, freed, busy


# -- processes -------------------------------------------------------------------------

PR_SET_PDEATHSIG = 1
# Started under this shell, a command dies with this process even when its
# own children (a compiler driver's cc1, as, ld) would survive a signal to
# the command alone: the shell gets SIGTERM when this process ends
# (PR_SET_PDEATHSIG) and kills its whole process group. The command runs in
# the background because a shell runs its traps only between commands.
SUPERVISOR = 'trap "kill -KILL 0" TERM HUP; "$@" & wait $!'


@functools.lru_cache(maxsize=None)
def _prctl():
    """libc's ``prctl`` (Linux), or ``None`` where there is none."""
    if not sys.platform.startswith('linux'):
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    prctl.restype = ctypes.c_int
    return prctl


def _death_signal(sig):
    """A ``preexec_fn`` that makes the child receive ``sig`` when this
    process's calling thread ends, and exit at once if it already has."""
    prctl, parent = _prctl(), os.getpid()

    def preexec():
        prctl(PR_SET_PDEATHSIG, sig, 0, 0, 0)
        if os.getppid() != parent:       # the parent died before prctl took effect
            os._exit(1)
    return preexec


def run_in_own_group(cmd, timeout=None, cwd=None, with_children=True):
    """Run ``cmd`` to completion and return its ``CompletedProcess`` (output as
    text), in a session and process group of its own that ends with this process.

    - ``timeout`` (seconds, or ``None``): the whole group is killed and
      ``subprocess.TimeoutExpired`` raised;
    - any exception while waiting (``KeyboardInterrupt``, or ``Terminated``
      inside ``terminate_cleanly``): the group is killed, then it propagates;
    - this process killed, even by SIGKILL (Linux): ``cmd`` gets a death
      signal (``PR_SET_PDEATHSIG``); ``with_children`` starts it under
      ``SUPERVISOR`` so that its children die too (its exit status is then
      the shell's: 128 + N for a command killed by signal N).

    The death signal follows the *thread* that started the command (see
    prctl(2)): that thread waits here until the command ends, so it cannot
    end first. ``OSError`` if ``cmd`` cannot be started.
    """
    preexec = None
    if _prctl() is not None:
        if with_children and os.path.exists('/bin/sh'):
            cmd = ['/bin/sh', '-c', SUPERVISOR, 'micrograd-supervisor', *cmd]
            preexec = _death_signal(signal.SIGTERM)
        else:
            preexec = _death_signal(signal.SIGKILL)
    proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, errors='replace', cwd=cwd,
                            start_new_session=True, preexec_fn=preexec)
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired as e:
        kill_process_group(proc)
        e.output, e.stderr = proc.communicate()
        raise
    except BaseException:
        kill_process_group(proc)
        proc.wait()
        raise
    return subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)


def kill_process_group(proc):
    """SIGKILL the process group led by ``proc`` (started with
    ``start_new_session=True``): a compiler driver's children (cc1, as, ld)
    go with it."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        proc.kill()


class Terminated(BaseException):
    """SIGTERM or SIGHUP arrived inside ``terminate_cleanly``."""


@contextlib.contextmanager
def terminate_cleanly(signals=(signal.SIGTERM, signal.SIGHUP)):
    """Let cleanup run when this process is told to end while the block runs.

    By default SIGTERM and SIGHUP end a Python process at once, without
    running ``finally`` blocks, so a compiler it started would be left
    running. Inside this block (in the main thread, and only for signals
    still at their default action) they raise ``Terminated`` instead; once it
    has propagated out of the block, cleaning up on its way, the default
    action is restored and the signal raised again, ending the process as it
    would have ended. Nothing is installed elsewhere or outside the block.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    ours = [s for s in signals if signal.getsignal(s) == signal.SIG_DFL]
    received = []

    def handler(signum, frame):
        received.append(signum)
        raise Terminated(signal.Signals(signum).name)

    for s in ours:
        signal.signal(s, handler)
    try:
        yield
    except Terminated:
        if not received:
            raise
    finally:
        for s in ours:
            signal.signal(s, signal.SIG_DFL)
        if received:
            signal.raise_signal(received[0])
    if received:                       # the signal is blocked in this thread: still stop
        raise Terminated(signal.Signals(received[0]).name)


def disk_is_full(path, margin=1 << 20):
    """The file system holding ``path`` has less than ``margin`` bytes free."""
    try:
        st = os.statvfs(path)
    except OSError:
        return False
    return st.f_bavail * st.f_frsize < margin


def is_out_of_space(error):
    """``error`` (an ``OSError``) means the disk or a quota is full."""
    return isinstance(error, OSError) and error.errno in (errno.ENOSPC, errno.EDQUOT)
