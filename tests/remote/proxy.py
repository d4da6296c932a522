"""An HTTP proxy in front of a local S3 server (moto): adds latency, caps bandwidth per connection, counts
requests and bytes, and can answer like a hostile or failing store (a status instead of the answer, a lying
listing). The client under test talks S3 to it as to any endpoint; nothing leaves localhost.
"""

from __future__ import annotations

import http.client
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

# (method, path with query) -> (status, S3 error code) to answer instead of forwarding, or None
Fault = Callable[[str, str], tuple[int, str] | None]
Rewrite = Callable[[str, str, bytes], bytes]  # (method, path, upstream body) -> body sent to the client

_HOP = {"connection", "keep-alive", "transfer-encoding", "content-length", "server", "date"}


@dataclass
class Throttle:
    """What the proxy does to each request; change it between runs (it is read per request)."""

    latency_s: float = 0.0
    bytes_per_s: float = 0.0  # per connection; 0: unlimited
    fault: Fault | None = None
    # (path, first byte, length) of a ranged GET -> (status, S3 error code) to answer instead, or None
    fault_at: Callable[[str, int, int], tuple[int, str] | None] | None = None
    rewrite: Rewrite | None = None
    serve_ranges: bool = False  # answer ranged GETs from a copy of the object fetched once (see _ranged)
    cut: Callable[[str, str], bool] | None = None  # (method, path) -> send half the body, then hang up
    requests: int = 0
    bytes_out: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def reset(self) -> None:
        """No delay, no fault, counters at zero."""
        with self.lock:
            self.latency_s, self.bytes_per_s, self.fault, self.rewrite = 0.0, 0.0, None, None
            self.fault_at = None
            self.serve_ranges = False
            self.cut = None
            self.requests = self.bytes_out = 0

    def count(self, nbytes: int) -> None:
        with self.lock:
            self.requests += 1
            self.bytes_out += nbytes


class S3Proxy:
    """`with S3Proxy(upstream_port) as proxy: proxy.url` forwards to moto on 127.0.0.1:upstream_port."""

    def __init__(self, upstream_port: int, throttle: Throttle | None = None) -> None:
        self.throttle = throttle or Throttle()
        handler = _handler(upstream_port, self.throttle)
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> S3Proxy:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


def _handler(upstream_port: int, t: Throttle) -> type[BaseHTTPRequestHandler]:
    objects: dict[str, tuple[bytes, str]] = {}  # path -> (body, ETag), for serve_ranges

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: object) -> None:  # quiet
            pass

        def _forward(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else b""
            if t.latency_s:
                time.sleep(t.latency_s)
            fault = t.fault(self.command, self.path) if t.fault else None
            rng = self.headers.get("Range", "")
            if fault is None and t.fault_at is not None and rng.startswith("bytes="):
                first, _, last = rng.removeprefix("bytes=").partition("-")
                fault = t.fault_at(self.path, int(first), int(last) - int(first) + 1)
            if fault is not None:
                status, code = fault
                data = f"<?xml version='1.0'?><Error><Code>{code}</Code><Message>injected</Message></Error>".encode()
                self._send(status, [("Content-Type", "application/xml")], data)
                return
            if (
                t.serve_ranges
                and self.command == "GET"
                and self.headers.get("Range")
                and "?" not in self.path
            ):
                self._ranged()
                return
            conn = http.client.HTTPConnection("127.0.0.1", upstream_port, timeout=60)
            try:
                headers = {
                    k: v for k, v in self.headers.items() if k.lower() not in ("connection", "keep-alive")
                }
                conn.request(self.command, self.path, body=body, headers=headers)
                resp = conn.getresponse()
                data = resp.read()
                status, out_headers = resp.status, resp.getheaders()
            finally:
                conn.close()
            if t.rewrite is not None:
                data = t.rewrite(self.command, self.path, data)
            kept = [(k, v) for k, v in out_headers if k.lower() not in _HOP]
            if self.command == "HEAD":  # no body, but the length the GET would have (what `info` asks)
                kept += [(k, v) for k, v in out_headers if k.lower() == "content-length"]
            self._send(status, kept, data)

        def _ranged(self) -> None:
            """A ranged GET answered from the whole object, fetched from moto once per key and ETag: moto
            reads the whole object for every ranged GET, which would make moto, not the client, the thing a
            benchmark measures. Status, headers and If-Match follow S3 (206, Content-Range, 412)."""
            whole = objects.get(self.path)
            if whole is None:
                conn = http.client.HTTPConnection("127.0.0.1", upstream_port, timeout=120)
                try:
                    headers = {
                        k: v for k, v in self.headers.items() if k.lower() not in ("range", "if-match")
                    }
                    conn.request("GET", self.path, headers=headers)
                    resp = conn.getresponse()
                    data = resp.read()
                    if resp.status != 200:
                        self._send(resp.status, resp.getheaders(), data)
                        return
                    whole = (data, resp.getheader("ETag") or "")
                    objects[self.path] = whole
                finally:
                    conn.close()
            data, etag = whole
            if self.headers.get("If-Match") not in (None, etag):
                self._send(
                    412,
                    [("Content-Type", "application/xml")],
                    b"<Error><Code>PreconditionFailed</Code></Error>",
                )
                return
            first, _, last = self.headers["Range"].removeprefix("bytes=").partition("-")
            lo, hi = int(first), min(int(last), len(data) - 1)
            rng = f"bytes {lo}-{hi}/{len(data)}"
            self._send(
                206, [("ETag", etag), ("Content-Range", rng), ("Accept-Ranges", "bytes")], data[lo : hi + 1]
            )

        def _send(self, status: int, headers: list[tuple[str, str]], data: bytes) -> None:
            self.send_response(status)
            for k, v in headers:
                self.send_header(k, v)
            if self.command != "HEAD" or not any(k.lower() == "content-length" for k, _ in headers):
                self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            if self.command != "HEAD" and t.cut is not None and t.cut(self.command, self.path):
                self.wfile.write(data[: len(data) // 2])  # the declared length never arrives
                self.close_connection = True
            elif self.command != "HEAD":
                self._write(data)
            t.count(len(data))

        def _write(self, data: bytes) -> None:
            if not t.bytes_per_s:
                self.wfile.write(data)
                return
            step = 64 << 10
            start = time.monotonic()
            for pos in range(0, len(data), step):
                self.wfile.write(data[pos : pos + step])
                due = start + (pos + step) / t.bytes_per_s
                if (wait := due - time.monotonic()) > 0:
                    time.sleep(wait)

        do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _forward

    return Handler
