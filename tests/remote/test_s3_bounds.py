"""Time bounded on s3://: a store that drips its answer (body or headers) a byte a second, or never answers, ends in a clear
error naming the URL within the bounds set through the environment (ZI_REMOTE_STALL_TIMEOUT,
ZI_REMOTE_DEADLINE, ZI_REMOTE_CONNECT_TIMEOUT), not after botocore's defaults or never."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from tests.remote.hostile import silent_endpoint
from tests.remote.proxy import S3Proxy

pytestmark = [pytest.mark.s3, pytest.mark.timeout(300)]


def _bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ZI_REMOTE_STALL_TIMEOUT", "2")
    monkeypatch.setenv("ZI_REMOTE_DEADLINE", "4")
    monkeypatch.setenv("ZI_REMOTE_CONNECT_TIMEOUT", "2")
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")


def _scan_ends_saying(cli: Any, url: str, words: str, what: str) -> None:
    """`scan URL` fails in a clear error that says `words` and names the URL, no traceback; how long it took
    is printed (a figure to read, never asserted)."""
    start = time.monotonic()
    result = cli("scan", url, timeout=120)
    took = time.monotonic() - start
    assert result.rc != 0, result.output
    assert words in result.output, result.output
    assert url in result.output
    assert "Traceback" not in result.output
    print(f"\n{what}: ended after {took:.1f} s")


@pytest.mark.parametrize("where", ["drip", "drip_headers"], ids=["body", "headers"])
def test_a_store_dripping_ends_at_the_deadline(
    where: str, proxy: S3Proxy, s3_demo: tuple[str, Path], cli: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The body, or the status line and headers, a byte a second, each within the 2 s stall timeout: the
    body's watchdog, or for the headers the connection's own timer (botocore has no hook before the body),
    ends it at the 4 s deadline."""
    url, _ = s3_demo
    _bounded(monkeypatch)
    setattr(proxy.throttle, where, lambda method, path: method == "GET" and "list-type" not in path)
    _scan_ends_saying(cli, url, "did not end within 4 s", where)


def test_a_silent_store_ends_at_the_stall_timeout(
    s3_demo: tuple[str, Path], cli: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    url, _ = s3_demo
    _bounded(monkeypatch)
    with silent_endpoint() as dead:
        monkeypatch.setenv("AWS_ENDPOINT_URL", dead)
        _scan_ends_saying(cli, url, "sent nothing within 2 s", "silent")


def test_a_store_pacing_its_body_under_the_stall_timeout_ends_at_the_low_speed_bound(
    proxy: S3Proxy, s3_demo: tuple[str, Path], cli: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A body a byte a second never trips the stall timeout (each byte comes within it) and the deadline is
    set far away (an hour): the low-speed bound (curl's --speed-limit/--speed-time) ends it once a 2 s window
    has brought less than 1,024 bytes a second."""
    url, _ = s3_demo
    _bounded(monkeypatch)
    monkeypatch.setenv("ZI_REMOTE_DEADLINE", "3600")
    monkeypatch.setenv("ZI_REMOTE_LOW_SPEED_TIME", "2")
    proxy.throttle.drip = lambda method, path: method == "GET" and "list-type" not in path
    _scan_ends_saying(cli, url, "slower than 1024 bytes a second", "slow body")
