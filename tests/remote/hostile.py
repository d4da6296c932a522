"""Hostile servers on localhost for the trust tests: an HTTP server that answers ranged reads with other bytes
(several ways), drips its answers a byte a second, or never answers; and a TCP listener that accepts and stays
silent (for any store's endpoint). Each serves a folder with http.server's directory pages, so fsspec lists it
as it lists the honest server in servers.py."""

from __future__ import annotations

import functools
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import ThreadingHTTPServer
from pathlib import Path

from tests.remote.servers import _Ranges

LIE_ABOVE = (
    256 << 10
)  # the scan's small reads (a few 64 KiB blocks) are answered honestly; the tensor data is not


class _Hostile(_Ranges):
    mode = "honest"  # set on the subclass a server is built with

    def answer(self, path: str, size: int, lo: int, hi: int) -> None:
        n = hi - lo + 1
        mode = self.mode if n > LIE_ABOVE else "honest"
        if mode == "silent":
            time.sleep(3600)
            return
        status, first, claim = 206, lo, f"bytes {lo}-{hi}/{size}"
        if mode == "shifted":  # another slice of the right length, its own range named honestly
            first = lo - 4 if lo >= 4 else lo + 4
            claim = f"bytes {first}-{first + n - 1}/{size}"
        elif mode == "unlabelled":  # another slice of the right length, no Content-Range at all
            first, claim = (lo - 4 if lo >= 4 else lo + 4), ""
        elif mode == "ignored":  # Range ignored: a 200 with the object's first n bytes
            status, first, claim = 200, 0, ""
        with open(path, "rb") as f:
            f.seek(first)
            data = f.read(n)
        self.send_response(status)
        if claim:
            self.send_header("Content-Range", claim)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if mode == "drip":
            for i in range(len(data)):
                self.wfile.write(data[i : i + 1])
                self.wfile.flush()
                time.sleep(1.0)
            return
        self.wfile.write(data)


@contextmanager
def hostile_http(root: Path, mode: str) -> Iterator[str]:
    """`http://127.0.0.1:PORT` serving `root`, its ranged reads above LIE_ABOVE answered per `mode`."""
    handler = type("Handler", (_Hostile,), {"mode": mode})
    server = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(handler, directory=str(root)))
    server.daemon_threads = True
    server.handle_error = lambda request, address: None  # type: ignore[method-assign]  # a client hung up
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@contextmanager
def silent_endpoint() -> Iterator[str]:
    """`http://127.0.0.1:PORT`: connections accepted and held, nothing ever answered."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(64)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        listener.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(listener.accept()[0])
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    finally:
        stop.set()
        thread.join(timeout=5)
        for conn in held:
            conn.close()
        listener.close()
