"""An HTTP proxy in front of a local S3 server (moto): adds latency, caps bandwidth per connection and for
the whole proxy (one proxy per simulated node: the node's NIC or its share of the store), counts requests and
bytes, and can answer like a hostile or failing store (a status instead of the answer, a lying listing). The
client under test talks S3 to it as to any endpoint; nothing leaves localhost.

Run on its own (`python tests/remote/proxy.py --upstream PORT ...`, see `main`) it is a process of its own,
so a benchmark's proxies do not share the interpreter (and its GIL) with moto or with each other; it prints
its URL on the first line and answers `GET /__proxy__/stats` (requests, bytes) and `/__proxy__/reset`.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
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
    node_bytes_per_s: float = 0.0  # every connection of this proxy together (one node's cap); 0: unlimited
    fault: Fault | None = None
    # (path, first byte, length) of a ranged GET -> (status, S3 error code) to answer instead, or None
    fault_at: Callable[[str, int, int], tuple[int, str] | None] | None = None
    rewrite: Rewrite | None = None
    serve_ranges: bool = False  # answer ranged GETs from a copy of the object fetched once (see _ranged)
    # "/bucket/prefix" -> local folder holding the same files: ranged GETs under it are read from the file
    # (the ETag from one HEAD to moto), so N proxies need no copy of the checkpoint in memory
    serve_from: dict[str, str] = field(default_factory=dict)
    cut: Callable[[str, str], bool] | None = None  # (method, path) -> send half the body, then hang up
    drip: Callable[[str, str], bool] | None = None  # (method, path) -> send the body a byte a second
    drip_headers: Callable[[str, str], bool] | None = None  # (method, path) -> the status line and headers too
    requests: int = 0
    bytes_out: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)
    _node_free_at: float = 0.0  # when the node's link is next free (a shared timeline every chunk books)

    def reset(self) -> None:
        """No delay, no fault, counters at zero."""
        with self.lock:
            self.latency_s, self.bytes_per_s, self.fault, self.rewrite = 0.0, 0.0, None, None
            self.node_bytes_per_s = 0.0
            self.serve_from = {}
            self.fault_at = None
            self.serve_ranges = False
            self.cut = self.drip = self.drip_headers = None
            self.requests = self.bytes_out = 0

    def count(self, nbytes: int) -> None:
        with self.lock:
            self.requests += 1
            self.bytes_out += nbytes

    def book(self, nbytes: int) -> float:
        """Book `nbytes` on the node's link: the monotonic time they have finished crossing it, so that all
        connections together never pass node_bytes_per_s (0: now)."""
        if not self.node_bytes_per_s:
            return 0.0
        with self.lock:
            start = max(time.monotonic(), self._node_free_at)
            self._node_free_at = start + nbytes / self.node_bytes_per_s
            return self._node_free_at


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
    etags: dict[str, str] = {}  # path -> ETag, for serve_from

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: object) -> None:  # quiet
            pass

        def _forward(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else b""
            if self.path.startswith("/__proxy__/"):
                self._control()
                return
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
            if self.command == "GET" and self.headers.get("Range") and "?" not in self.path and t.serve_from:
                local = next(
                    (
                        d + self.path[len(k) :]
                        for k, d in t.serve_from.items()
                        if self.path.startswith(k + "/")
                    ),
                    None,
                )
                if local is not None:
                    self._from_file(local)
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

        def _control(self) -> None:
            """The benchmark's side door: counters as JSON, or reset them."""
            if self.path == "/__proxy__/reset":
                with t.lock:
                    t.requests = t.bytes_out = 0
            doc = json.dumps({"requests": t.requests, "bytes_out": t.bytes_out}).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(doc)))
            self.end_headers()
            self.wfile.write(doc)

        def _from_file(self, local: str) -> None:
            """A ranged GET answered from the local copy of the object; its ETag (for If-Match and the
            answer) is moto's, asked once per object with a HEAD."""
            etag = etags.get(self.path)
            if etag is None:
                conn = http.client.HTTPConnection("127.0.0.1", upstream_port, timeout=60)
                try:
                    headers = {
                        k: v for k, v in self.headers.items() if k.lower() not in ("range", "if-match")
                    }
                    conn.request("HEAD", self.path, headers=headers)
                    resp = conn.getresponse()
                    resp.read()
                    if resp.status != 200:
                        self._send(resp.status, [], b"")
                        return
                    etag = etags[self.path] = resp.getheader("ETag") or ""
                finally:
                    conn.close()
            if self.headers.get("If-Match") not in (None, etag):
                self._send(412, [], b"<Error><Code>PreconditionFailed</Code></Error>")
                return
            size = os.path.getsize(local)
            first, _, last = self.headers["Range"].removeprefix("bytes=").partition("-")
            lo, hi = int(first), min(int(last), size - 1)
            with open(local, "rb") as f:
                data = os.pread(f.fileno(), hi - lo + 1, lo)
            rng = f"bytes {lo}-{hi}/{size}"
            self._send(206, [("ETag", etag), ("Content-Range", rng), ("Accept-Ranges", "bytes")], data)

        def _send(self, status: int, headers: list[tuple[str, str]], data: bytes) -> None:
            self.send_response(status)
            for k, v in headers:
                self.send_header(k, v)
            if self.command != "HEAD" or not any(k.lower() == "content-length" for k, _ in headers):
                self.send_header("Content-Length", str(len(data)))
            if t.drip_headers is not None and t.drip_headers(self.command, self.path):
                self._headers_buffer.append(b"\r\n")  # type: ignore[attr-defined]
                head, self._headers_buffer = b"".join(self._headers_buffer), []  # type: ignore[attr-defined]
                self._drip(head)
                self.close_connection = True
                return
            self.end_headers()
            if self.command != "HEAD" and t.cut is not None and t.cut(self.command, self.path):
                self.wfile.write(data[: len(data) // 2])  # the declared length never arrives
                self.close_connection = True
            elif self.command != "HEAD":
                self._write(data)
            t.count(len(data))

        def _drip(self, data: bytes) -> None:
            """`data` a byte a second, until the client gives up."""
            try:
                for i in range(len(data)):
                    self.wfile.write(data[i : i + 1])
                    self.wfile.flush()
                    time.sleep(1.0)
            except OSError:  # the client gave up, as it should
                self.close_connection = True

        def _write(self, data: bytes) -> None:
            if t.drip is not None and t.drip(self.command, self.path):
                self._drip(data)
                return
            if not t.bytes_per_s and not t.node_bytes_per_s:
                self.wfile.write(data)
                return
            step = 64 << 10
            start = time.monotonic()
            for pos in range(0, len(data), step):
                chunk = data[pos : pos + step]
                # the later of this connection's own pace and the node link's next free slot
                due = max(
                    start + (pos + len(chunk)) / t.bytes_per_s if t.bytes_per_s else 0.0, t.book(len(chunk))
                )
                if (wait := due - time.monotonic()) > 0:
                    time.sleep(wait)
                self.wfile.write(chunk)

        do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _forward

    return Handler


def main() -> None:
    """One proxy as a process of its own: prints its URL, serves until killed."""
    ap = argparse.ArgumentParser(description=main.__doc__)
    ap.add_argument("--upstream", type=int, required=True, help="moto's port on 127.0.0.1")
    ap.add_argument("--latency-ms", type=float, default=0.0)
    ap.add_argument("--mbps", type=float, default=0.0, help="cap per connection, MB/s (0: none)")
    ap.add_argument("--node-mbps", type=float, default=0.0, help="cap for all connections together, MB/s")
    ap.add_argument("--serve-from", action="append", default=[], help="/bucket/prefix=LOCAL_FOLDER")
    args = ap.parse_args()
    throttle = Throttle(latency_s=args.latency_ms / 1000, bytes_per_s=args.mbps * 1e6)
    throttle.node_bytes_per_s = args.node_mbps * 1e6
    throttle.serve_from = dict(item.split("=", 1) for item in args.serve_from)
    with S3Proxy(args.upstream, throttle) as proxy:
        print(proxy.url, flush=True)
        threading.Event().wait()


if __name__ == "__main__":
    main()
