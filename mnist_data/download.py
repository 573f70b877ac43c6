"""Fetching the full MNIST set into a cache folder, verified by SHA-256."""

import hashlib
import urllib.request
from pathlib import Path

from compiler.files import atomic_write, sha256_file

# PyTorch's mirror: yann.lecun.com often refuses scripted downloads.
MNIST_URL = "https://ossci-datasets.s3.amazonaws.com/mnist/"
# SHA-256 of the original 1998 files (the same bytes on every mirror).
MNIST_SHA256 = {
    "train-images-idx3-ubyte.gz": "440fcabf73cc546fa21475e81ea370265605f56be210a4024d2ca8f203523609",
    "train-labels-idx1-ubyte.gz": "3552534a0a558bbed6aed32b30c495cca23d567ec52cac8be1a0730e8010255c",
    "t10k-images-idx3-ubyte.gz": "8d422c7b0a1c1c79245a5bcf07fe86e33eeafee792b84584aec276f5a2dbc4e6",
    "t10k-labels-idx1-ubyte.gz": "f7ae60f92e00ec6debd23a6088c31dbd2371eca3ffa0defaefb259924204aec6",
}
CHUNK = 1 << 20


class ChecksumError(ValueError):
    """A downloaded file's SHA-256 is not the pinned one."""


def _fetch_verified(url, target, expected, timeout):
    """Download `url` to `target` only if its SHA-256 is `expected`.

    Written through `atomic_write`: `target` is either absent, the old file,
    or verified bytes.
    """
    try:
        digest = hashlib.sha256()
        with atomic_write(target) as out, urllib.request.urlopen(url, timeout=timeout) as response:
            for chunk in iter(lambda: response.read(CHUNK), b""):
                digest.update(chunk)
                out.write(chunk)
            if digest.hexdigest() != expected:
                raise ChecksumError(
                    f"{target.name}: SHA-256 mismatch for {url}: expected {expected}, "
                    f"got {digest.hexdigest()}; nothing was saved"
                )
    except BaseException as e:
        if not isinstance(e, ChecksumError):
            e.add_note(f"while downloading {url} to {target}")
        raise


def download_mnist(cache_dir, base_url=MNIST_URL, timeout=60.0, sha256=MNIST_SHA256):
    """Make `cache_dir` hold every file of `sha256` (name -> hex digest), fetched from `base_url`.

    Files already there with the right hash are not fetched again. Returns the
    folder, ready for `mnist_data.load`.
    """
    cache_dir = Path(cache_dir)
    cache_dir.mkdir(parents=True, exist_ok=True)
    base_url = base_url.rstrip("/") + "/"
    for name, expected in sha256.items():
        target = cache_dir / name
        if target.is_file() and sha256_file(target) == expected:
            continue
        _fetch_verified(base_url + name, target, expected, timeout)
    return cache_dir
