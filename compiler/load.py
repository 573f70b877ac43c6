"""Import a built ``nn`` extension as a fresh, independent module object.

The module uses multi-phase initialisation and keeps its arrays in module
state, so every load (of the same file or of another graph's) gets its own
arrays. It is not entered in ``sys.modules``: nothing can hand one graph's
module to another.

The dynamic loader keeps every shared object it opened, by name: opening a
path again returns the code first loaded from it (by this loader, or by an
``import nn`` from that folder), even if the file has been replaced since
(a re-export into the same folder, a cache entry rebuilt in place). So a
file is never opened where it lies: its bytes are copied (and hashed as they
are copied) into a private file named by their SHA-256, and that copy is
loaded. The same name means the same bytes, so a second load of unchanged
bytes may reuse the code already open; changed bytes get a new name. The
copy is removed once loaded (the loader keeps it mapped).
"""
import atexit
import contextlib
import hashlib
import importlib.machinery
import importlib.util
import os
import shutil
import tempfile
import threading

_lock = threading.Lock()
_folder = None               # this process's private folder for the copies


class ChangedFile(ImportError):
    """The file is not the one that was checked: its SHA-256 differs."""


def _exec(name_path, path):
    loader = importlib.machinery.ExtensionFileLoader('nn', name_path)
    spec = importlib.util.spec_from_file_location('nn', name_path, loader=loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    module.__file__ = path
    return module


def _private_folder():
    global _folder
    if _folder is None or not os.path.isdir(_folder):
        _folder = tempfile.mkdtemp(prefix='micrograd-load-')
        atexit.register(shutil.rmtree, _folder, ignore_errors=True)
    return _folder


def _copy(path, folder):
    """``path`` copied into ``folder`` as ``nn-<sha256>.so``: (copy, checksum)."""
    fd, temp = tempfile.mkstemp(dir=folder, prefix='.nn-', suffix='.tmp')
    try:
        digest = hashlib.sha256()
        with open(path, 'rb') as src, os.fdopen(fd, 'wb') as dst:
            for chunk in iter(lambda: src.read(1 << 20), b''):
                digest.update(chunk)
                dst.write(chunk)
        checksum = digest.hexdigest()
        copy = os.path.join(folder, f'.nn-{checksum}.so')
        os.replace(temp, copy)
        return copy, checksum
    except BaseException:
        with contextlib.suppress(OSError):
            os.remove(temp)
        raise


def load_module(path, sha256=None):
    """A new module object from the shared object at ``path``. With
    ``sha256``, the bytes loaded must have that checksum (``ChangedFile``
    otherwise): the file is then exactly the one that was checked."""
    path = os.path.abspath(path)
    with _lock:
        copy, checksum = _copy(path, _private_folder())
        try:
            if sha256 is not None and checksum != sha256:
                raise ChangedFile(f"{path} is not the file that was checked: its SHA-256 is now "
                                  f"{checksum}, not {sha256}", path=path)
            try:
                return _exec(copy, path)
            except ImportError as e:
                # the temporary folder is mounted noexec: try beside the original
                folder = os.path.dirname(path)
                if 'failed to map segment' not in str(e) or not os.access(folder, os.W_OK):
                    raise
                with contextlib.suppress(OSError):
                    os.remove(copy)
                copy, checksum = _copy(path, folder)
                if sha256 is not None and checksum != sha256:
                    raise ChangedFile(f"{path} is not the file that was checked: its SHA-256 is now "
                                      f"{checksum}, not {sha256}", path=path) from None
                return _exec(copy, path)
        finally:
            with contextlib.suppress(OSError):
                os.remove(copy)
