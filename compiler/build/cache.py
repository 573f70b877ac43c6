"""The build cache: its folder, its keys, its entries, their locks, the size
cap, and trust in what it holds.

Folder: ``$MICROGRAD_CACHE_DIR``, else ``$XDG_CACHE_HOME/micrograd-compiler``,
else ``~/.cache/micrograd-compiler``; ``MICROGRAD_CACHE`` set to ``0``,
``false``, ``no`` or ``off`` (any case) builds in a temporary folder instead.
A shared object that someone else can replace would run as the user, so the
folder is the user's alone: it is created with mode 0o700; the default
folder, if it exists with wider permissions, is narrowed to 0o700; a
``$MICROGRAD_CACHE_DIR`` is left as it is, but refused if another user owns
it or it is writable by group or others. A ``$MICROGRAD_CACHE_DIR`` that
cannot be used (not a folder, read-only, unwritable, full) raises
``CacheError`` naming it; the default folder being unusable (no home
folder, read-only, full...) makes builds fall back to a private temporary
folder, with one ``UserWarning`` per process.

Entries: one per build key (32 hex digits, a hash of everything that decides
the binary): ``KEY.so`` (a shared object) or ``KEY.o`` (one translation
unit's object), ``KEY.sha256`` (its checksum, written once it passed its
checks: ``trusted`` reads it), ``KEY.c`` (the source; after a failed build it
is all that is left) and ``KEY.lock`` (held with ``flock`` while ``KEY`` is
being built). A build's temporaries (``.tmp-KEY-PID.so``,
``.KEY.c.XXXX.tmp``...) carry its key too, and exist only while their
builder holds ``KEY.lock``: a temporary whose lock is free belongs to a dead
build. Each use of an entry marks it (its mtime). A build first sweeps the
temporaries of dead builds, and afterwards removes least recently used
entries (failed builds' sources first, never the one just built) until the
folder's entries total at most ``$MICROGRAD_CACHE_MAX`` (``500M``, ``2G``...;
default 1 GiB). ``toolchains/`` keeps the compilers' identities, each with
its program's ``stat`` (``compiler.build.toolchain`` probes a compiler again
once it changed). Anything else in the folder (``mnist/`` downloads) is not
an entry and is never touched here. ``python -m compiler cache --info``/
``--clear`` show and empty it (the identities too).
"""
import contextlib
import errno
import fcntl
import hashlib
import json
import os
import re
import shutil
import stat
import sysconfig
import threading
import warnings
from dataclasses import dataclass

from compiler.build import toolchain
from compiler.build.errors import FREE_SPACE_HINT, CacheError
from compiler.build.toolchain import native_target, python_include, wants_native
from compiler.build.verify import elf_problem
from compiler.files import remove_if_present, sha256_file, write_atomically

# -- the folder ------------------------------------------------------------------------

CACHE_FOLDER_NAME = 'micrograd-compiler'


def default_cache_root():
    """``$XDG_CACHE_HOME/micrograd-compiler``, else ``~/.cache/micrograd-compiler``."""
    base = os.environ.get('XDG_CACHE_HOME') or os.path.join(os.path.expanduser('~'), '.cache')
    return os.path.join(base, CACHE_FOLDER_NAME)


def cache_root():
    """The folder for builds and downloads: ``$MICROGRAD_CACHE_DIR`` if set, else
    ``default_cache_root()``. Not created here."""
    return os.environ.get('MICROGRAD_CACHE_DIR') or default_cache_root()


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


def cache_problem(root, what, full=False):
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
            raise cache_problem(root, f"the home folder {home!r} (HOME="
                                 f"{os.environ.get('HOME')!r}) does not exist")
    if os.path.exists(root) and not os.path.isdir(root):
        raise cache_problem(root, "it is a file, not a folder")
    try:
        os.makedirs(root, mode=0o700, exist_ok=True)
        _check_private(root, narrow=not cache_chosen())
    except NotADirectoryError:
        raise cache_problem(root, "a part of its path is a file, not a folder") from None
    except OSError as e:
        raise cache_problem(root, describe(e)) from None
    return root


# -- compilers' identities (compiler.build.toolchain probes them) -------------------------

IDENTITIES = 'toolchains'


def _identity_file(path, args):
    """``toolchains/<hash>.json`` in the cache folder for the program at
    ``path`` run with ``args``, or None without a usable cache folder."""
    try:
        root = cache_dir()
    except (CacheError, OSError):
        return None
    if root is None:
        return None
    name = hashlib.sha256('\0'.join([path, *args]).encode()).hexdigest()[:32]
    return os.path.join(root, IDENTITIES, name + '.json')


def recall_identity(path, args, stamp):
    """The fields kept for ``path`` and ``args`` when the program had ``stamp``, or None."""
    where = _identity_file(path, args)
    if where is None:
        return None
    try:
        with open(where) as f:
            kept = json.load(f)
    except (OSError, ValueError):
        return None
    if not isinstance(kept, dict) or [kept.get(k) for k in ('path', 'args', 'stamp')] != [path, args, stamp]:
        return None
    return kept.get('fields')


def keep_identity(path, args, stamp, fields):
    where = _identity_file(path, args)
    if where is None:
        return
    try:
        os.makedirs(os.path.dirname(where), mode=0o700, exist_ok=True)
        write_atomically(where, json.dumps({'path': path, 'args': args, 'stamp': stamp, 'fields': fields}))
    except OSError:
        pass


toolchain.remember_in(recall_identity, keep_identity)


def describe(error):
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


def warn_fallback(problem):
    """Say once per process that the default cache is unusable and builds are not cached."""
    global _fallback_warned
    with _fallback_lock:
        if _fallback_warned:
            return
        _fallback_warned = True
    warnings.warn(f"{problem}. Building in a private temporary folder instead: nothing is cached "
                  "(set MICROGRAD_CACHE_DIR to a writable folder, or MICROGRAD_CACHE=0 to build "
                  "without a cache and without this warning)", UserWarning, stacklevel=4)


# -- keys --------------------------------------------------------------------------------

def build_key(source, toolchain, flags, include_dir=None):
    """The cache key: a hash of the compiler's path, version and leading
    arguments, each flag (and, for ``-march=native``, what it resolves to
    here), the Python headers' folder and extension suffix, and the source
    (which names the generator's version). Each part is length-prefixed, so
    no two lists of parts collide."""
    parts = [toolchain.path, toolchain.version, *toolchain.args, '--', *flags, '--']
    if wants_native(flags):
        parts.append(native_target(toolchain))
    parts += [python_include(include_dir), sysconfig.get_config_var('EXT_SUFFIX') or '', source]
    h = hashlib.sha256()
    for part in parts:
        data = part.encode('utf-8', 'surrogateescape')
        h.update(len(data).to_bytes(8, 'little'))
        h.update(data)
    return h.hexdigest()[:32]


# -- entries, temporaries, the size cap ----------------------------------------------

def touch(path):
    """Mark ``path`` as just used (its mtime and atime are now): the cache's
    least-recently-used order. A read-only cache is used without marking."""
    try:
        os.utime(path)
    except OSError:
        pass


KEY = re.compile(r'[0-9a-f]{32}')
ENTRY_FILE = re.compile(r'([0-9a-f]{32})\.(so|o|sha256|c|lock)')
TEMPORARY = re.compile(r'\..*?([0-9a-f]{32})')
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
    """Remove every entry and dead temporary of the cache folder ``root``,
    and the compilers' identities. Returns (entries removed, bytes freed,
    entries left because they are being built)."""
    sweep_temporaries(root)
    shutil.rmtree(os.path.join(root, IDENTITIES), ignore_errors=True)
    removed = freed = busy = 0
    for entry in cache_entries(root):
        if remove_entry(root, entry):
            removed, freed = removed + 1, freed + entry.size
        else:
            busy += 1
    return removed, freed, busy


# -- trust: a checksum recorded once the checks passed -------------------------------------

VERIFIED = 'checked-1'        # KEY.sha256 is '<sha256> checked-1': written after the checks passed


def record(path, digest):
    """Record ``path`` (checked) as trusted: its checksum into ``digest``.
    Returns the checksum."""
    checksum = sha256_file(path)
    write_atomically(digest, f'{checksum} {VERIFIED}\n')
    return checksum


def trusted(path, digest):
    """The checksum of the cached shared object or object file ``path`` if it
    was checked when it was recorded in ``digest``, is unchanged since (its
    SHA-256) and still looks whole; else ``None``."""
    try:
        with open(digest) as f:
            recorded = f.read().split()
        if len(recorded) != 2 or recorded[1] != VERIFIED or sha256_file(path) != recorded[0]:
            return None
    except OSError:
        return None
    return recorded[0] if elf_problem(path, kind=1 if path.endswith('.o') else 3) is None else None


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
        raise cache_problem(root, f"its damaged entry {name} cannot be removed "
                             f"({describe(e)})") from None


# -- the disk ----------------------------------------------------------------------------

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
