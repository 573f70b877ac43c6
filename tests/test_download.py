"""download_mnist against a real HTTP server on loopback; no other network."""

import contextlib
import functools
import hashlib
import os
import shutil
import socket
import subprocess
import threading
import urllib.error
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np
import pytest

import mnist_train
from mnist_data import ChecksumError, DownloadError, download_mnist, load, write_idx
from mnist_data import download as download_module
from mnist_data.download import MNIST_SHA256, MNIST_SIZES
from mnist_data.folder import FILE_NAMES, SPLIT_FILES

GZ_NAMES = [f"{name}.gz" for name in FILE_NAMES]
TIMEOUT = 5.0
HINT = "(another mirror: --mirror URL; files already on disk: --data DIR)"


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

    with serve(functools.partial(Handler, directory=folder)) as url:
        yield Mirror(url, folder, {name: sha256_of(folder / name) for name in GZ_NAMES}, requests)


@contextlib.contextmanager
def serve(handler):
    """The URL of an HTTP server on 127.0.0.1 answering with `handler`, for the block."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True  # a handler still writing must not hold up the shutdown
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(TIMEOUT)


class QuietHandler(BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass


class EndlessHandler(QuietHandler):
    """Answers every GET with zeros until the client hangs up, with no Content-Length.

    Stops after SAFETY_BYTES only so that a downloader without a cap fails
    this test instead of filling the disk.
    """

    SAFETY_BYTES = 256 << 20

    def do_GET(self):
        self.send_response(200)
        self.end_headers()
        zeros = bytes(1 << 20)
        with contextlib.suppress(OSError):  # the client hanging up is the point
            for _ in range(self.SAFETY_BYTES // len(zeros)):
                self.wfile.write(zeros)


def check_download_error(error, url, target):
    """The one-line message of `error` names the URL, the file and the way out."""
    message = str(error)
    assert isinstance(error, DownloadError) and isinstance(error, OSError)  # mnist_train catches OSError
    assert "\n" not in message
    assert f"cannot download {url} to {target}:" in message
    assert message.endswith(f"; nothing was saved {HINT}")
    return message


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
    message = check_download_error(info.value, mirror.url + name, cache / name)
    assert isinstance(info.value, ValueError)  # as before DownloadError existed
    assert "SHA-256 mismatch" in message
    assert f"expected {mirror.sha256[name]}" in message
    assert f"got {sha256_of(mirror.folder / name)}" in message
    # Files before it in the table were verified and kept; no trace of it, nor any temp file.
    assert sorted(p.name for p in cache.iterdir()) == sorted(GZ_NAMES[:tampered])


def test_missing_file_on_server_leaves_nothing(mirror, tmp_path):
    (mirror.folder / GZ_NAMES[0]).unlink()
    cache = tmp_path / "cache"
    with pytest.raises(DownloadError) as info:
        download(mirror, cache)
    message = check_download_error(info.value, mirror.url + GZ_NAMES[0], cache / GZ_NAMES[0])
    assert ": HTTP 404 File not found;" in message
    assert isinstance(info.value.__cause__, urllib.error.HTTPError) and info.value.__cause__.code == 404
    assert list(cache.iterdir()) == []


# --- hostile or broken mirrors, full disks: one clear error, nothing saved ----
# Before DownloadError, each of these surfaced as a raw OSError, URLError or
# IncompleteRead whose message named neither the URL nor the file, and an
# endless mirror was read until the disk was full.


def test_endless_mirror_is_cut_off_at_the_pinned_size(tmp_path, monkeypatch):
    monkeypatch.setenv("no_proxy", "*")
    cache = tmp_path / "cache"
    name = GZ_NAMES[0]
    with serve(EndlessHandler) as url:
        with pytest.raises(DownloadError) as info:
            download_mnist(cache, base_url=url, timeout=TIMEOUT)  # the pinned MNIST table
    message = check_download_error(info.value, url + name, cache / name)
    assert f"the server sends more than the {MNIST_SIZES[name]} bytes expected" in message
    assert not isinstance(info.value, ChecksumError)  # refused on size, not after reading it all
    assert list(cache.iterdir()) == []


def test_endless_mirror_is_cut_off_for_a_custom_table(tmp_path, monkeypatch):
    """A table the caller pinned has no sizes: the cap is MAX_DOWNLOAD_BYTES."""
    monkeypatch.setenv("no_proxy", "*")
    monkeypatch.setattr(download_module, "MAX_DOWNLOAD_BYTES", 3 << 20)
    cache = tmp_path / "cache"
    sha256 = {name: "0" * 64 for name in GZ_NAMES}
    with serve(EndlessHandler) as url:
        with pytest.raises(DownloadError) as info:
            download_mnist(cache, base_url=url, timeout=TIMEOUT, sha256=sha256)
    message = check_download_error(info.value, url + GZ_NAMES[0], cache / GZ_NAMES[0])
    assert f"more than the {3 << 20} bytes expected" in message
    assert list(cache.iterdir()) == []


class ShortHandler(QuietHandler):
    """Announces 1000 bytes (plainly or as one chunk), sends 10, hangs up."""

    protocol_version = "HTTP/1.1"  # for chunked transfers

    def do_GET(self):
        chunked = self.path.startswith("/chunked/")
        self.send_response(200)
        self.send_header(*(("Transfer-Encoding", "chunked") if chunked else ("Content-Length", "1000")))
        self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write((b"3e8\r\n" if chunked else b"") + b"x" * 10)


@pytest.mark.parametrize("transfer", ["plain", "chunked"])
def test_short_transfer(tmp_path, monkeypatch, transfer):
    monkeypatch.setenv("no_proxy", "*")
    cache = tmp_path / "cache"
    with serve(ShortHandler) as url:
        base_url = url + ("chunked/" if transfer == "chunked" else "")
        with pytest.raises(DownloadError) as info:
            download_mnist(cache, base_url=base_url, timeout=TIMEOUT)
    message = check_download_error(info.value, base_url + GZ_NAMES[0], cache / GZ_NAMES[0])
    if transfer == "plain":
        assert ": the connection closed 990 bytes short of the announced size;" in message
    else:
        assert ": the connection closed mid-transfer;" in message
    assert list(cache.iterdir()) == []


def test_silent_server_times_out(tmp_path, monkeypatch):
    answered = threading.Event()

    class SilentHandler(QuietHandler):
        def do_GET(self):
            self.send_response(200)
            self.end_headers()
            answered.wait(TIMEOUT)  # then hang up, having sent no body

    monkeypatch.setenv("no_proxy", "*")
    cache = tmp_path / "cache"
    with serve(SilentHandler) as url:
        try:
            with pytest.raises(DownloadError) as info:
                download_mnist(cache, base_url=url, timeout=0.2)
        finally:
            answered.set()
    message = check_download_error(info.value, url + GZ_NAMES[0], cache / GZ_NAMES[0])
    assert "no answer within 0.2 s" in message
    assert list(cache.iterdir()) == []


@pytest.fixture
def closed_port_url():
    """A loopback URL nothing listens on: connecting is refused at once."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}/"


def test_unreachable_mirror(tmp_path, closed_port_url, monkeypatch):
    monkeypatch.setenv("no_proxy", "*")
    cache = tmp_path / "cache"
    with pytest.raises(DownloadError) as info:
        download_mnist(cache, base_url=closed_port_url, timeout=TIMEOUT)
    message = check_download_error(info.value, closed_port_url + GZ_NAMES[0], cache / GZ_NAMES[0])
    assert "Connection refused" in message
    assert list(cache.iterdir()) == []


def test_malformed_mirror_url(tmp_path):
    cache = tmp_path / "cache"
    with pytest.raises(DownloadError) as info:
        download_mnist(cache, base_url="no-scheme.example", timeout=TIMEOUT)
    check_download_error(info.value, "no-scheme.example/" + GZ_NAMES[0], cache / GZ_NAMES[0])
    assert list(cache.iterdir()) == []


def test_cli_prints_one_line_naming_url_file_and_way_out(tmp_path, closed_port_url, monkeypatch, capsys):
    monkeypatch.setenv("no_proxy", "*")
    monkeypatch.setenv("MICROGRAD_CACHE_DIR", str(tmp_path / "cache"))
    status = mnist_train.main(["--download", "--mirror", closed_port_url])
    err = capsys.readouterr().err
    assert status == 1 and "Traceback" not in err
    target = tmp_path / "cache" / "mnist" / GZ_NAMES[0]
    assert err == f"error: cannot download {closed_port_url}{GZ_NAMES[0]} to {target}: " \
                  f"Connection refused; nothing was saved {HINT}\n"


@pytest.fixture
def tiny_disk(tmp_path):
    """A 64 KiB tmpfs: a real full disk, without filling the real one."""
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("mounting a 64 KiB tmpfs for a full disk needs root and mount(8)")
    disk = tmp_path / "disk"
    disk.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(disk)],
                             capture_output=True, text=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs for a full disk: {mounted.stderr.strip()}")
    try:
        yield disk
    finally:
        subprocess.run(["umount", str(disk)], check=True)


def test_full_disk_leaves_nothing(mirror, tiny_disk):
    name = GZ_NAMES[0]
    big = np.random.default_rng(1).integers(0, 256, 256 << 10, dtype=np.uint8).tobytes()
    (mirror.folder / name).write_bytes(big)  # 256 KiB that cannot be compressed or stored
    mirror.sha256[name] = sha256_of(mirror.folder / name)
    cache = tiny_disk / "cache"
    with pytest.raises(DownloadError) as info:
        download(mirror, cache)
    message = check_download_error(info.value, mirror.url + name, cache / name)
    assert ": No space left on device;" in message
    assert list(cache.iterdir()) == []


def test_pinned_hashes_cover_the_folder_layout():
    assert sorted(MNIST_SHA256) == sorted(GZ_NAMES)
    assert all(len(h) == 64 and int(h, 16) >= 0 for h in MNIST_SHA256.values())
