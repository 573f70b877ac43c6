"""Reading and writing IDX files, the format MNIST is distributed in.

An IDX file (http://yann.lecun.com/exdb/mnist/, bottom of the page) is:
two zero bytes, one type-code byte, one byte giving the number of
dimensions, then each dimension as a big-endian uint32, then the values
in C order, big-endian. MNIST images are magic 0x00000803 (ubyte, 3 dims),
labels 0x00000801 (ubyte, 1 dim).
"""

import gzip
import math
import os
import stat
import struct
import zlib
from pathlib import Path

import numpy as np

# Type code (third byte of the magic) -> element type. The format stores
# every multi-byte value big-endian.
IDX_DTYPES = {
    0x08: np.dtype(">u1"),
    0x09: np.dtype(">i1"),
    0x0B: np.dtype(">i2"),
    0x0C: np.dtype(">i4"),
    0x0D: np.dtype(">f4"),
    0x0E: np.dtype(">f8"),
}
IMAGES_MAGIC = 0x00000803
LABELS_MAGIC = 0x00000801
GZIP_MAGIC = b"\x1f\x8b"
# The largest payload a header may claim. The full MNIST training images are
# 47 MB and EMNIST's largest split about 550 MB; beyond this a header is far
# more likely hostile or corrupt than real.
MAX_PAYLOAD_BYTES = 4 << 30
CHUNK = 1 << 20


class IDXError(ValueError):
    """An IDX file is malformed, or is not the IDX file the caller expected."""


def idx_magic(array):
    """The 32-bit magic number an IDX file holding `array` starts with."""
    for code, dtype in IDX_DTYPES.items():
        if dtype == array.dtype.newbyteorder(">"):
            return code << 8 | array.ndim
    supported = ", ".join(d.name for d in IDX_DTYPES.values())
    raise IDXError(f"IDX cannot hold dtype {array.dtype}; it holds {supported}")


def read_idx(path):
    """The array stored in the IDX file at `path` (raw or gzip), native byte order.

    Reads no more than the header says the file holds (plus one byte, to see
    trailing garbage): a gzip bomb is refused after that many bytes, not
    after expanding it all.
    """
    with open(path, "rb") as file:
        # Detect gzip by content, not by name: renamed and hand-gunzipped files
        # are common among MNIST copies.
        if file.peek(2)[:2] != GZIP_MAGIC:
            return _read_stream(file, path, _regular_file_size(file))
        try:
            with gzip.GzipFile(fileobj=file) as stream:
                return _read_stream(stream, path, None)
        except (OSError, EOFError, zlib.error) as e:
            raise IDXError(f"{path}: corrupt gzip data ({e})") from e


def _regular_file_size(file):
    """The size of `file` if it is a regular file (a pipe or device has none)."""
    status = os.fstat(file.fileno())
    return status.st_size if stat.S_ISREG(status.st_mode) else None


def _read_up_to(stream, n):
    """At most `n` bytes of `stream`, fewer only where it ends.

    Grown chunk by chunk rather than allocated up front, so a header claiming
    gigabytes costs only the bytes that actually follow it.
    """
    data = bytearray()
    while len(data) < n:
        chunk = stream.read(min(CHUNK, n - len(data)))
        if not chunk:
            break
        data += chunk
    return data


def _read_stream(stream, path, file_size):
    """The IDX array in `stream`; `file_size` (None if unknown) only sharpens messages."""
    magic = _read_up_to(stream, 4)
    if len(magic) < 4:
        raise IDXError(f"{path}: {len(magic)} bytes is too short for an IDX magic number")
    if magic[0] != 0 or magic[1] != 0 or magic[2] not in IDX_DTYPES:
        codes = ", ".join(f"0x{c:02X}" for c in IDX_DTYPES)
        raise IDXError(
            f"{path}: bad magic 0x{magic.hex().upper()}: an IDX file starts with "
            f"two zero bytes and a type code ({codes})"
        )
    dtype, ndim = IDX_DTYPES[magic[2]], magic[3]
    if ndim == 0:
        raise IDXError(f"{path}: header declares 0 dimensions; IDX needs at least 1")
    header_len = 4 + 4 * ndim
    dims = _read_up_to(stream, 4 * ndim)
    if len(dims) < 4 * ndim:
        raise IDXError(
            f"{path}: truncated header: {ndim} dimensions need {header_len} bytes, "
            f"got {4 + len(dims)}"
        )
    shape = struct.unpack(f">{ndim}I", dims)
    expected = math.prod(shape) * dtype.itemsize  # exact: no overflow on absurd headers
    where = f"header says shape {'x'.join(map(str, shape))} of {dtype.name}, {expected} bytes"
    if expected > MAX_PAYLOAD_BYTES:
        raise IDXError(
            f"{path}: {where}, more than the {MAX_PAYLOAD_BYTES >> 30} GiB this reader accepts"
        )
    payload = _read_up_to(stream, expected + 1)
    got = len(payload)
    if got < expected:
        raise IDXError(f"{path}: truncated payload: {where}; got {got}")
    if got > expected:
        if file_size is None:  # gzip: counting the rest would mean expanding it all
            got = f"more (stopped reading after {expected + 1})"
        else:
            got = f"{file_size - header_len} ({file_size - header_len - expected} extra)"
        raise IDXError(f"{path}: trailing garbage: {where}; got {got}")
    # The bytearray is writable and no one else holds it: no copy for bytes.
    array = np.frombuffer(payload, dtype=dtype).reshape(shape)
    return array.astype(dtype.newbyteorder("="), copy=False)


def write_idx(path, array):
    """Store `array` as an IDX file; gzip it (reproducibly, mtime 0) if `path` ends in .gz."""
    array = np.asarray(array)
    magic = idx_magic(array)
    header = struct.pack(f">I{array.ndim}I", magic, *array.shape)
    data = header + array.astype(IDX_DTYPES[magic >> 8]).tobytes()
    if str(path).endswith(".gz"):
        data = gzip.compress(data, mtime=0)
    Path(path).write_bytes(data)


def _read_expecting(path, magic, what):
    array = read_idx(path)
    if idx_magic(array) != magic:
        raise IDXError(
            f"{path}: {what} need magic 0x{magic:08X}, this file has 0x{idx_magic(array):08X} "
            f"({array.ndim} dimensions of {array.dtype.name})"
        )
    return array


def load_pair(images_path, labels_path):
    """MNIST-style (images uint8 [N, rows, cols], labels uint8 [N]) with matching N, labels 0..9."""
    images = _read_expecting(images_path, IMAGES_MAGIC, "images")
    labels = _read_expecting(labels_path, LABELS_MAGIC, "labels")
    if len(images) != len(labels):
        raise IDXError(
            f"{images_path} holds {len(images)} images but {labels_path} holds "
            f"{len(labels)} labels"
        )
    if labels.size and labels.max() > 9:
        bad = int(np.argmax(labels > 9))
        raise IDXError(f"{labels_path}: label {labels[bad]} at index {bad} is outside 0..9")
    return images, labels
