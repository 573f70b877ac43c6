"""Finding the Fashion-MNIST files installed by Debian's `dataset-fashion-mnist` package."""

import shutil
import subprocess
from pathlib import Path

from .folder import FILE_NAMES

DEBIAN_PACKAGE = "dataset-fashion-mnist"
# Where Debian 12 puts them, and a spelling older or derived packages might use;
# checked first so the common case needs no subprocess.
KNOWN_DIRS = [Path("/usr/share/datasets/fashion-mnist"), Path("/usr/share/dataset-fashion-mnist")]
MARKER = FILE_NAMES[0] + ".gz"  # train-images-idx3-ubyte.gz


def _listed_by_dpkg():
    """The folder that `dpkg -L` says holds the marker file, or None."""
    if shutil.which("dpkg") is None:
        return None
    listing = subprocess.run(
        ["dpkg", "-L", DEBIAN_PACKAGE], capture_output=True, text=True, timeout=30
    )
    if listing.returncode != 0:  # not installed: dpkg says so on stderr
        return None
    for line in listing.stdout.splitlines():
        path = Path(line.strip())
        if path.name == MARKER:
            return path.parent
    return None


def debian_fashion_mnist_dir():
    """The folder of Debian's Fashion-MNIST IDX files, or None if the package is not installed."""
    for folder in KNOWN_DIRS:
        if (folder / MARKER).is_file():
            return folder
    folder = _listed_by_dpkg()
    # dpkg lists what was installed; the files may have been removed since.
    return folder if folder is not None and (folder / MARKER).is_file() else None
