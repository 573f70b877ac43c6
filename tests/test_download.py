"""download_mnist against a real HTTP server on loopback; no other network."""

import functools
import hashlib
import threading
import urllib.error
from dataclasses import dataclass
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np
import pytest

from mnist_data import ChecksumError, download_mnist, load, write_idx
from mnist_data.download import MNIST_SHA256
from mnist_data.folder import FILE_NAMES, SPLIT_FILES

GZ_NAMES = [f"{name}.gz" for name in FILE_NAMES]
TIMEOUT = 5.0


@dataclass
class Mirror:
    url: str
    folder: Path
    sha256: dict
    requests: list


def write_small_mnist(folder):
    rng = np.random.default_rng(0)
    for (images_name, labels_name), n in zip(SPLIT_FILES.values(), [20, 7]):
        write_idx(folder / f"{images_name}.gz", rng.integers(0, 256, (n, 28, 28), dtype=np.uint8))
        write_idx(folder / f"{labels_name}.gz", rng.integers(0, 10, n, dtype=np.uint8))


def sha256_of(path):
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture
def mirror(tmp_path, monkeypatch):
    """A folder of small MNIST .gz files served over HTTP on 127.0.0.1, with their hashes."""
    monkeypatch.setenv("no_proxy", "*")  # never send loopback requests through a proxy
    folder = tmp_path / "mirror"
    folder.mkdir()
    write_small_mnist(folder)
    requests = []

    class Handler(SimpleHTTPRequestHandler):
        def do_GET(self):
            requests.append(self.path.lstrip("/"))
            super().do_GET()

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Handler, directory=folder))
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/"
        yield Mirror(url, folder, {name: sha256_of(folder / name) for name in GZ_NAMES}, requests)
    finally:
        server.shutdown()
        server.server_close()
        thread.join(TIMEOUT)


def download(mirror, cache):
    return download_mnist(cache, base_url=mirror.url, timeout=TIMEOUT, sha256=mirror.sha256)


def test_download_then_load(mirror, tmp_path):
    cache = tmp_path / "cache" / "mnist"  # created on demand
    folder = download_mnist(cache, base_url=mirror.url.rstrip("/"), timeout=TIMEOUT, sha256=mirror.sha256)
    assert folder == cache
    assert sorted(p.name for p in cache.iterdir()) == sorted(GZ_NAMES)
    for name in GZ_NAMES:
        assert (cache / name).read_bytes() == (mirror.folder / name).read_bytes()
    data = load(cache)
    assert data["train"][0].shape == (20, 28, 28) and data["test"][1].shape == (7,)
    assert sorted(mirror.requests) == sorted(GZ_NAMES)


def test_verified_files_are_not_fetched_again(mirror, tmp_path):
    cache = tmp_path / "cache"
    download(mirror, cache)
    download(mirror, cache)
    assert len(mirror.requests) == 4
    (cache / GZ_NAMES[1]).write_bytes(b"stale partial download")
    download(mirror, cache)
    assert mirror.requests[4:] == [GZ_NAMES[1]]
    assert sha256_of(cache / GZ_NAMES[1]) == mirror.sha256[GZ_NAMES[1]]


@pytest.mark.parametrize("tampered", range(4))
def test_tampered_file_fails_and_leaves_nothing(mirror, tmp_path, tampered):
    name = GZ_NAMES[tampered]
    with open(mirror.folder / name, "ab") as f:
        f.write(b"\0")  # after the hashes were taken
    cache = tmp_path / "cache"
    with pytest.raises(ChecksumError) as info:
        download(mirror, cache)
    message = str(info.value)
    assert name in message
    assert f"expected {mirror.sha256[name]}" in message
    assert f"got {sha256_of(mirror.folder / name)}" in message
    # Files before it in the table were verified and kept; no trace of it, nor any temp file.
    assert sorted(p.name for p in cache.iterdir()) == sorted(GZ_NAMES[:tampered])


def test_missing_file_on_server_leaves_nothing(mirror, tmp_path):
    (mirror.folder / GZ_NAMES[0]).unlink()
    cache = tmp_path / "cache"
    with pytest.raises(urllib.error.HTTPError) as info:
        download(mirror, cache)
    assert info.value.code == 404
    assert any(mirror.url + GZ_NAMES[0] in note for note in info.value.__notes__)
    assert list(cache.iterdir()) == []


def test_pinned_hashes_cover_the_folder_layout():
    assert sorted(MNIST_SHA256) == sorted(GZ_NAMES)
    assert all(len(h) == 64 and int(h, 16) >= 0 for h in MNIST_SHA256.values())
