"""The fixed C boilerplate of the generated ``nn`` extension module.

This folder is installed as the package ``compiler.templates`` (see
``pyproject.toml``); ``compiler/codegen`` fills its files' ``${placeholders}``.
"""
from importlib.resources import files


def read_template(name):
    """The text of the template file ``name`` (e.g. ``'module.c'``)."""
    return files(__name__).joinpath(name).read_text()
