"""The deadline for an `s3://` answer's status line and headers, which botocore leaves unbounded.

botocore's read timeout bounds each read from the socket, so a server that sends its headers a byte at a
time, each within the stall timeout, holds a request for ever, and botocore has no hook between sending a
request and reading its answer. This module gives one client's connection pools (the dict botocore's HTTP
session shares between its pool managers, direct and proxied) a connection class whose `getresponse` runs
under a timer: at the deadline (ZI_REMOTE_DEADLINE) the timer shuts the socket down, the blocked read
fails, and the thread that asked learns from `headers_timed_out` that the deadline, not the server, ended
it. The body has a watchdog of its own (`remote.s3.Watchdog`), which counts from the same start, so one
request, headers and body, ends within one deadline. botocore's retries (AWS_MAX_ATTEMPTS) still apply to a
request whose headers never arrived, as to any request that got no answer.
"""

from __future__ import annotations

import contextlib
import functools
import socket
import threading
import time
from typing import Any

from inspector.remote.backend import deadline

_FIRED = threading.local()  # per thread: the deadline ended this thread's last request before its headers


class Timer:
    """Shuts `sock` down `seconds` from `started` (a monotonic time), unless cancelled first."""

    def __init__(self, sock: Any, seconds: float, started: float | None = None) -> None:
        self.fired = False
        self._sock = sock
        left = seconds - (time.monotonic() - started) if started is not None else seconds
        self._timer = threading.Timer(max(0.0, left), self._fire)
        self._timer.daemon = True
        if sock is not None:
            self._timer.start()

    def _fire(self) -> None:
        self.fired = True
        with contextlib.suppress(OSError, AttributeError):  # already closed: the read ended meanwhile
            self._sock.shutdown(socket.SHUT_RDWR)

    def cancel(self) -> None:
        self._timer.cancel()


def headers_timed_out() -> bool:
    """Whether the deadline ended this thread's last request while its headers dripped in (and forget it)."""
    fired = bool(getattr(_FIRED, "value", False))
    _FIRED.value = False
    return fired


def started_at(conn: Any) -> float | None:
    """When the connection began waiting for the answer it is reading now (None: not a bounded one)."""
    value = getattr(conn, "zi_started", None)
    return value if isinstance(value, float) else None


@functools.cache
def _pools() -> dict[str, type]:
    """The bounded pool classes, built once (botocore imported only here, on first use)."""
    from botocore.awsrequest import (
        AWSHTTPConnection,
        AWSHTTPConnectionPool,
        AWSHTTPSConnection,
        AWSHTTPSConnectionPool,
    )

    http_conn = _bounded(AWSHTTPConnection)
    https_conn = _bounded(AWSHTTPSConnection)
    return {
        "http": type("BoundedHTTPConnectionPool", (AWSHTTPConnectionPool,), {"ConnectionCls": http_conn}),
        "https": type("BoundedHTTPSConnectionPool", (AWSHTTPSConnectionPool,), {"ConnectionCls": https_conn}),
    }


def _bounded(base: Any) -> type:
    """`base` whose `getresponse` (the status line and headers) runs under the deadline's timer."""

    def getresponse(self: Any, *args: Any, **kwargs: Any) -> Any:
        self.zi_started = time.monotonic()
        timer = Timer(self.sock, deadline(), self.zi_started)
        try:
            return base.getresponse(self, *args, **kwargs)
        finally:
            timer.cancel()
            _FIRED.value = timer.fired

    return type(f"Bounded{base.__name__}", (base,), {"getresponse": getresponse})


def bound_headers(client: Any) -> bool:
    """Give a new boto3 client's connections the header deadline; False where this botocore keeps its HTTP
    session elsewhere (the bound is then the stall timeout per byte, as before)."""
    session = getattr(getattr(client, "_endpoint", None), "http_session", None)
    pools = getattr(session, "_pool_classes_by_scheme", None)
    if not isinstance(pools, dict) or set(pools) != {"http", "https"}:
        return False
    pools.update(_pools())  # the one dict every pool manager of the session builds its pools from
    return True
