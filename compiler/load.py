"""Import a built ``nn`` extension as a fresh, independent module object.

The module uses multi-phase initialisation and keeps its arrays in module
state, so every load (of the same file or of another graph's) gets its own
arrays. It is not entered in ``sys.modules``: nothing can hand one graph's
module to another.

The dynamic loader keeps every shared object it opened, by name: opening a
path again returns the code first loaded from it, even if the file has been
replaced since (a damaged or foreign cache entry rebuilt in place). So a
path whose file changed since this process loaded it is loaded through a
private copy under a new name.
"""
import importlib.machinery
import importlib.util
import os
import shutil
import tempfile
import threading

_loaded = {}                 # real path -> identity of the file loaded from it
_loaded_lock = threading.Lock()


def _identity(path):
    st = os.stat(path)
    return st.st_dev, st.st_ino, st.st_size     # not the mtime: the cache touches it on use


def _exec(name_path, path):
    loader = importlib.machinery.ExtensionFileLoader('nn', name_path)
    spec = importlib.util.spec_from_file_location('nn', name_path, loader=loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    if name_path != path:
        module.__file__ = path
    return module


def load_module(path):
    path = os.path.abspath(path)
    real = os.path.realpath(path)
    identity = _identity(real)
    with _loaded_lock:
        before = _loaded.setdefault(real, identity)
    if before == identity:
        return _exec(path, path)
    folder = tempfile.mkdtemp(prefix='micrograd-load-')
    try:
        copy = os.path.join(folder, os.path.basename(path))
        shutil.copyfile(real, copy)
        return _exec(copy, path)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
