"""Fetching the full MNIST set into a cache folder, verified by SHA-256."""

import contextlib
import hashlib
import http.client
import os
import tempfile
import urllib.error
import urllib.request
from pathlib import Path

# PyTorch's mirror: yann.lecun.com often refuses scripted downloads.
MNIST_URL = "https://ossci-datasets.s3.amazonaws.com/mnist/"
# SHA-256 and size in bytes of the original 1998 files (the same bytes on every mirror).
MNIST_SHA256 = {
    "train-images-idx3-ubyte.gz": "440fcabf73cc546fa21475e81ea370265605f56be210a4024d2ca8f203523609",
    "train-labels-idx1-ubyte.gz": "3552534a0a558bbed6aed32b30c495cca23d567ec52cac8be1a0730e8010255c",
    "t10k-images-idx3-ubyte.gz": "8d422c7b0a1c1c79245a5bcf07fe86e33eeafee792b84584aec276f5a2dbc4e6",
    "t10k-labels-idx1-ubyte.gz": "f7ae60f92e00ec6debd23a6088c31dbd2371eca3ffa0defaefb259924204aec6",
}
MNIST_SIZES = {
    "train-images-idx3-ubyte.gz": 9912422,
    "train-labels-idx1-ubyte.gz": 28881,
    "t10k-images-idx3-ubyte.gz": 1648877,
    "t10k-labels-idx1-ubyte.gz": 4542,
}
# The cap for a file whose hash the caller pinned without a size: generous,
# yet a mirror that never stops sending cannot fill the disk.
MAX_DOWNLOAD_BYTES = 64 << 20
CHUNK = 1 << 20
HINT = "another mirror: --mirror URL; files already on disk: --data DIR"


class DownloadError(OSError):
    """A file could not be fetched and verified; nothing of it was saved.

    An OSError, as the network and disk errors it stands for are.
    """


class ChecksumError(DownloadError, ValueError):
    """A downloaded file's SHA-256 is not the pinned one."""


def sha256_file(path):
    """The hex SHA-256 of the file at ``path``."""
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


@contextlib.contextmanager
def _replacing(target):
    """A binary file object whose contents replace ``target`` only when the
    block ends without an exception (a temporary file beside it, renamed
    over it); on failure nothing is left behind. A data package needs no
    more, so it does not borrow the compiler's ``atomic_write``."""
    fd, temp = tempfile.mkstemp(dir=os.path.dirname(os.path.abspath(target)), suffix=".tmp",
                                prefix=f".{os.path.basename(target)}.")
    try:
        with os.fdopen(fd, "wb") as f:
            yield f
        os.replace(temp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.remove(temp)
        raise


def _describe(error, timeout):
    """What went wrong, in a few words, for the error message."""
    if isinstance(error, urllib.error.HTTPError):
        return f"HTTP {error.code} {error.reason}"
    if isinstance(error, urllib.error.URLError):  # the cause hides in .reason, or is it
        if not isinstance(error.reason, BaseException):
            return str(error.reason)
        error = error.reason
    if isinstance(error, TimeoutError):
        return f"no answer within {timeout:g} s"
    if isinstance(error, http.client.IncompleteRead):  # a chunked body cut short
        return "the connection closed mid-transfer"
    if isinstance(error, OSError) and error.strerror:
        return error.strerror
    return str(error) or type(error).__name__


def _fetch_verified(url, target, expected, max_bytes, timeout):
    """Download `url` to `target` only if its SHA-256 is `expected` and it is at most `max_bytes`.

    Written through `_replacing`: `target` is either absent, the old file,
    or verified bytes. Every failure is a `DownloadError` naming `url` and `target`.
    """

    def download_error(problem, error_type=DownloadError):
        return error_type(f"cannot download {url} to {target}: {problem}; nothing was saved ({HINT})")

    digest = hashlib.sha256()
    size = 0
    try:
        with _replacing(target) as out, urllib.request.urlopen(url, timeout=timeout) as response:
            # Read one byte past the cap, never more: enough to tell "too big".
            while chunk := response.read(min(CHUNK, max_bytes + 1 - size)):
                size += len(chunk)
                if size > max_bytes:
                    raise download_error(f"the server sends more than the {max_bytes} bytes expected")
                digest.update(chunk)
                out.write(chunk)
            # http.client ends a body cut short of its Content-Length quietly,
            # leaving the shortfall in .length (None without a Content-Length).
            if short := getattr(response, "length", None):
                raise download_error(f"the connection closed {short} bytes short of the announced size")
            if digest.hexdigest() != expected:
                raise download_error(
                    f"SHA-256 mismatch: expected {expected}, got {digest.hexdigest()}", ChecksumError
                )
    except DownloadError:
        raise
    # URLError and timeouts are OSErrors; a malformed URL is a ValueError.
    except (OSError, ValueError, http.client.HTTPException) as e:
        raise download_error(_describe(e, timeout)) from e


def download_mnist(cache_dir, base_url=MNIST_URL, timeout=60.0, sha256=MNIST_SHA256):
    """Make `cache_dir` hold every file of `sha256` (name -> hex digest), fetched from `base_url`.

    Files already there with the right hash are not fetched again. A file is
    cut off at its pinned size in `MNIST_SIZES` if its hash is the pinned one,
    else at `MAX_DOWNLOAD_BYTES`. Raises `DownloadError` (an OSError) naming
    the URL and the file. Returns the folder, ready for `mnist_data.load`.
    """
    cache_dir = Path(cache_dir)
    cache_dir.mkdir(parents=True, exist_ok=True)
    base_url = base_url.rstrip("/") + "/"
    for name, expected in sha256.items():
        target = cache_dir / name
        if target.is_file() and sha256_file(target) == expected:
            continue
        pinned = expected == MNIST_SHA256.get(name)
        max_bytes = MNIST_SIZES[name] if pinned else MAX_DOWNLOAD_BYTES
        _fetch_verified(base_url + name, target, expected, max_bytes, timeout)
    return cache_dir
