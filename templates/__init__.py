"""C boilerplate of the generated ``nn`` extension module (``module.c``)."""
from importlib.resources import files


def read_template(name='module.c'):
    return files(__name__).joinpath(name).read_text()
