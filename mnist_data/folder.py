"""An MNIST-style folder: the four IDX files under their classic names.

Fashion-MNIST and other drop-in replacements use the same names, so one
loader serves them all.
"""

from pathlib import Path

from .idx import load_pair

# split -> (images file, labels file), as named by the original distribution.
SPLIT_FILES = {
    "train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
    "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
}
FILE_NAMES = [name for pair in SPLIT_FILES.values() for name in pair]
EMBEDDED_DIR = Path(__file__).parent / "embedded"


def _find(data_dir, name):
    """`name` or `name.gz` in `data_dir`, whichever exists (raw first), else None."""
    for candidate in (data_dir / name, data_dir / f"{name}.gz"):
        if candidate.is_file():
            return candidate
    return None


def load(data_dir):
    """{'train': (images, labels), 'test': (images, labels)} from an MNIST-style folder."""
    data_dir = Path(data_dir)
    found = {name: _find(data_dir, name) for name in FILE_NAMES}
    missing = [name for name, path in found.items() if path is None]
    if missing:
        looked_for = ", ".join(f"{name}[.gz]" for name in missing)
        raise FileNotFoundError(f"{data_dir}: missing MNIST files; looked for {looked_for}")
    return {
        split: load_pair(found[images], found[labels])
        for split, (images, labels) in SPLIT_FILES.items()
    }


def load_embedded():
    """The 4,000 + 1,000 real MNIST digits shipped inside this package (see embedded/README.md)."""
    return load(EMBEDDED_DIR)
