"""Import a built ``nn`` extension as a fresh, independent module object.

The module uses multi-phase initialisation and keeps its arrays in module
state, so every load (of the same file or of another graph's) gets its own
arrays. It is not entered in ``sys.modules``: nothing can hand one graph's
module to another.
"""
import importlib.machinery
import importlib.util


def load_module(path):
    loader = importlib.machinery.ExtensionFileLoader('nn', path)
    spec = importlib.util.spec_from_file_location('nn', path, loader=loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module
