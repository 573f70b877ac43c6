"""MNIST-format data: IDX files, the classic folder layout, an embedded subset.

    load(folder)                 -> {'train': (X, y), 'test': (X, y)}, X uint8 [N, 28, 28]
    load_embedded()              -> the same for 4,000 + 1,000 real digits shipped here
    debian_fashion_mnist_dir()   -> folder of Debian's Fashion-MNIST, or None
    download_mnist(cache_dir)    -> folder with the full MNIST, SHA-256 verified
    load_source(folder, ...)     -> (description, data) of what a command line asked for
    mnist_graph(hidden, seed)    -> the MLP and cross-entropy graph this project trains
    lenet_graph(seed)            -> the LeNet-5 style conv net's graph, the same input rows
    ModelSpec(name, hidden)      -> a model by its --model name: sizes, n_params, graph(seed)
    input_rows(images, labels)   -> its input rows: pixels / 255, then the one-hot label
"""

from .debian import debian_fashion_mnist_dir
from .download import ChecksumError, DownloadError, download_mnist
from .folder import load, load_embedded
from .idx import IDXError, load_pair, read_idx, write_idx
from .model import (MODELS, N_CLASSES, N_PIXELS, LeNetGraph, MnistGraph, ModelSpec, input_rows,
                    lenet_graph, mnist_graph)
from .source import load_source

__all__ = [
    "ChecksumError",
    "DownloadError",
    "IDXError",
    "debian_fashion_mnist_dir",
    "download_mnist",
    "load",
    "load_embedded",
    "load_source",
    "load_pair",
    "input_rows",
    "mnist_graph",
    "lenet_graph",
    "LeNetGraph",
    "ModelSpec",
    "MODELS",
    "MnistGraph",
    "N_CLASSES",
    "N_PIXELS",
    "read_idx",
    "write_idx",
]
