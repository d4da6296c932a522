"""Store servers on localhost beside moto's S3 (conftest.py), each behind our counting proxy, each holding the
demo checkpoint at `stage2/demo`:

- **az://**: Azurite (npm `azurite`; `tox -e remote` installs it under .tox, a developer with
  `npm install --prefix .azurite azurite@3.37.0`), reached through AZURE_STORAGE_CONNECTION_STRING.
- **gs://**: obstore's GCS client reads through GCS's XML API (an S3-style `?list-type=2` listing and ranged
  GETs); gcp-storage-emulator implements only the JSON API (its listing answers 501), so moto's S3 server
  stands in for the XML API, reached through GOOGLE_BASE_URL with GOOGLE_SKIP_SIGNATURE (objects public).
- **http://**: Python's http.server with byte ranges, read through fsspec's HTTPFileSystem, which lists by
  parsing the directory pages.

A server whose packages or binary are missing skips its tests with the reason.
"""

from __future__ import annotations

import functools
import os
import queue
import re
import shutil
import subprocess
import threading
from collections.abc import Iterator
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from inspector.demo.writer import DemoSpec
from tests.conftest import REPO_ROOT
from tests.remote.moto_s3 import moto_s3, upload_folder
from tests.remote.proxy import S3Proxy

CONTAINER = "ckpt"
# moto keeps its buckets per process, not per server: every moto server a test process starts shares them, so
# the GCS stand-in's bucket must not be the S3 tests' "ckpt" (their private uploads of the same keys, made after
# ours, made unsigned GCS reads 403 in one xdist ordering). No "-": object_store quotes it in a GCS bucket name.
GS_BUCKET = "gsckpt"
PREFIX = "stage2/demo"
SPEC = DemoSpec()  # the same demo as the S3 tests
# Azurite's fixed development account and key (public, in Azure's documentation): no secret
AZURITE_ACCOUNT = "devstoreaccount1"
AZURITE_KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="


def azurite_connection(endpoint: str, key: str = AZURITE_KEY) -> str:
    return (
        f"DefaultEndpointsProtocol=http;AccountName={AZURITE_ACCOUNT};AccountKey={key};"
        f"BlobEndpoint={endpoint}/{AZURITE_ACCOUNT};"
    )


def _files(folder: Path) -> list[Path]:
    return [p for p in sorted(folder.rglob("*")) if p.is_file()]


def _azurite_bin() -> str | None:
    for cand in (
        os.environ.get("ZI_AZURITE_BIN"),
        str(REPO_ROOT / ".azurite" / "node_modules" / ".bin" / "azurite-blob"),
        shutil.which("azurite-blob"),
    ):
        if cand and os.access(cand, os.X_OK):
            return cand
    return None


def _port_from(proc: subprocess.Popen[str], timeout: float = 60) -> int | None:
    """The port Azurite says it listens on; its output is drained for as long as it runs."""
    lines: queue.Queue[str] = queue.Queue()

    def drain() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.put(line)
        lines.put("")  # it exited

    threading.Thread(target=drain, daemon=True).start()
    while True:
        try:
            line = lines.get(timeout=timeout)
        except queue.Empty:
            return None
        if not line:
            return None
        m = re.search(r"listens on http://127\.0\.0\.1:(\d+)", line)
        if m:
            return int(m.group(1))


@pytest.fixture(scope="session")
def azurite(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[S3Proxy, int]]:
    """(proxy, Azurite's own port): Azurite on a random port, the proxy in front, the environment's
    connection string naming the proxy."""
    pytest.importorskip("obstore")
    pytest.importorskip("azure.storage.blob")
    exe = _azurite_bin()
    if exe is None:
        pytest.skip(
            "Azurite is not installed (npm install --prefix .azurite azurite@3.37.0; tox -e remote does)"
        )
    where = tmp_path_factory.mktemp("azurite")
    proc = subprocess.Popen(
        [exe, "--blobHost", "127.0.0.1", "--blobPort", "0", "--location", str(where), "--silent",
         "--skipApiVersionCheck", "--loose"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        port = _port_from(proc)
        if port is None:
            pytest.skip("Azurite did not start within 60 s (or exited)")
        with S3Proxy(port) as proxy, pytest.MonkeyPatch.context() as mp:
            mp.setenv("AZURE_STORAGE_CONNECTION_STRING", azurite_connection(proxy.url))
            yield proxy, port
    finally:
        proc.terminate()  # Azurite waits for idle keep-alive connections to close; it need not
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


@pytest.fixture(scope="session")
def az_demo(azurite: tuple[S3Proxy, int], demo: Any) -> tuple[str, Path]:
    """(URL, local root) of the demo checkpoint in an Azurite container and on disk."""
    from azure.storage.blob import BlobServiceClient

    local = demo(SPEC)
    client = BlobServiceClient.from_connection_string(azurite_connection(f"http://127.0.0.1:{azurite[1]}"))
    container = client.create_container(CONTAINER)
    for path in _files(local):
        with path.open("rb") as f:
            container.upload_blob(f"{PREFIX}/{path.relative_to(local).as_posix()}", f)
    return f"az://{CONTAINER}/{PREFIX}", local


@pytest.fixture(scope="session")
def gs_server() -> Iterator[tuple[S3Proxy, Any]]:
    """(proxy, boto3 client of the server): moto as GCS's XML API, the proxy in front of it."""
    pytest.importorskip("obstore")
    pytest.importorskip("boto3")
    pytest.importorskip("moto.server")
    with moto_s3() as (port, client), S3Proxy(port) as proxy, pytest.MonkeyPatch.context() as mp:
        mp.setenv("GOOGLE_BASE_URL", proxy.url)
        mp.setenv("GOOGLE_SKIP_SIGNATURE", "true")
        yield proxy, client


@pytest.fixture(scope="session")
def gs_demo(gs_server: tuple[S3Proxy, Any], demo: Any) -> tuple[str, Path]:
    _, client = gs_server
    local = demo(SPEC)
    upload_folder(client, local, GS_BUCKET, PREFIX, ACL="public-read")  # read unsigned, as a public bucket
    return f"gs://{GS_BUCKET}/{PREFIX}", local


class _Ranges(SimpleHTTPRequestHandler):
    """http.server's files and directory pages, plus `Range: bytes=a-b` (a 206 with exactly those bytes)."""

    def log_message(self, format: str, *args: object) -> None:
        pass

    def ranged(self) -> tuple[str, int, int, int] | None:
        """(file, its size, first, last byte) of a ranged GET of a file; None for anything else."""
        rng = re.fullmatch(r"bytes=(\d+)-(\d+)", self.headers.get("Range") or "")
        path = self.translate_path(self.path)
        if rng is None or not os.path.isfile(path):
            return None
        size = os.path.getsize(path)
        return path, size, int(rng.group(1)), min(int(rng.group(2)), size - 1)

    def do_GET(self) -> None:
        asked = self.ranged()
        if asked is None:
            super().do_GET()
        else:
            self.answer(*asked)

    def answer(self, path: str, size: int, lo: int, hi: int) -> None:
        """A ranged GET of bytes lo..hi of `path` (`size` bytes): exactly those, as a 206 (a hostile server
        answers otherwise)."""
        with open(path, "rb") as f:
            f.seek(lo)
            data = f.read(hi - lo + 1)
        self.send_response(206)
        self.send_header("Content-Range", f"bytes {lo}-{hi}/{size}")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


@pytest.fixture(scope="session")
def http_demo(tmp_path_factory: pytest.TempPathFactory, demo: Any) -> Iterator[tuple[str, Path, S3Proxy]]:
    """(URL, local root, proxy): the demo served by a local HTTP server, behind the counting proxy."""
    pytest.importorskip("fsspec")
    pytest.importorskip("aiohttp")
    local = demo(SPEC)
    root = tmp_path_factory.mktemp("http")
    shutil.copytree(local, root / PREFIX)
    server = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_Ranges, directory=str(root)))
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        with S3Proxy(server.server_address[1]) as proxy:
            yield f"{proxy.url}/{PREFIX}", local, proxy
    finally:
        server.shutdown()
        server.server_close()
