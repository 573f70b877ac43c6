"""The fixed C of the generated ``nn`` extension module, as files next to
this one (found from the package itself, so a checkout runs without an
install): real C, none filled in; ``compiler/codegen/module.py`` puts them
after a generated prologue of ``#define`` lines.
"""
from importlib.resources import files


def read_template(name):
    """The text of the template file ``name`` (e.g. ``'module.c'``)."""
    return files(__name__).joinpath(name).read_text()
