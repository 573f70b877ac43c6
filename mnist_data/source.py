"""The data a command line asks for: a folder, Debian's Fashion-MNIST, a
download, or the embedded subset, checked to be 28x28 images labelled 0..9."""

from .debian import debian_fashion_mnist_dir
from .download import MNIST_URL, download_mnist
from .folder import load, load_embedded
from .model import N_CLASSES


def load_source(folder=None, fashion=False, download_to=None, mirror=MNIST_URL):
    """``(description, {'train': (images, labels), 'test': (...)})``: the IDX
    files in ``folder``, else Fashion-MNIST (``fashion``), else the full MNIST
    fetched into ``download_to``, else the embedded digits. Raises
    ``FileNotFoundError`` or ``ValueError`` saying what is missing or wrong."""
    if folder:
        name, data = f"IDX files in {folder}", load(folder)
    elif fashion:
        found = debian_fashion_mnist_dir()
        if found is None:
            raise FileNotFoundError("--fashion needs Debian's Fashion-MNIST: apt-get install "
                                    "dataset-fashion-mnist (or pass --data DIR)")
        name, data = f"Fashion-MNIST ({found})", load(found)
    elif download_to:
        found = download_mnist(download_to, base_url=mirror)
        name, data = f"MNIST ({found})", load(found)
    else:
        name, data = "embedded MNIST subset", load_embedded()
    for split, (images, labels) in data.items():
        if images.shape[1:] != (28, 28) or not len(labels) or labels.max() >= N_CLASSES:
            raise ValueError(f"{name}: the {split} split is not 28x28 images labelled 0..9 "
                             f"(images of shape {images.shape}, labels {set(labels[:100].tolist())}...)")
    return name, data
