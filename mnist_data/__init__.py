"""MNIST-format data: IDX files, the classic folder layout, an embedded subset.

    load(folder)                 -> {'train': (X, y), 'test': (X, y)}, X uint8 [N, 28, 28]
    load_embedded()              -> the same for 4,000 + 1,000 real digits shipped here
    debian_fashion_mnist_dir()   -> folder of Debian's Fashion-MNIST, or None
    download_mnist(cache_dir)    -> folder with the full MNIST, SHA-256 verified
"""

from .debian import debian_fashion_mnist_dir
from .download import ChecksumError, download_mnist
from .folder import load, load_embedded
from .idx import IDXError, load_pair, read_idx, write_idx

__all__ = [
    "ChecksumError",
    "IDXError",
    "debian_fashion_mnist_dir",
    "download_mnist",
    "load",
    "load_embedded",
    "load_pair",
    "read_idx",
    "write_idx",
]
