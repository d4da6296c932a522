"""Bytes in, proven; time bounded: an http(s):// server that answers a ranged read with other bytes is refused
(convert fails non-zero, verify does not say OK), one that drips or never answers ends in a clear error naming
the URL within the bounds set through the environment. Servers: tests/remote/hostile.py, on localhost."""

from __future__ import annotations

import shutil
import time
from pathlib import Path
from typing import Any

import pytest

from tests.remote.hostile import hostile_http
from tests.remote.servers import PREFIX, SPEC

pytestmark = [pytest.mark.remote, pytest.mark.timeout(300)]


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory, demo: Any) -> tuple[Path, Path]:
    """(folder to serve, the demo's local root): the demo at `PREFIX` below the served folder."""
    pytest.importorskip("fsspec")
    pytest.importorskip("aiohttp")
    local = demo(SPEC)
    root = tmp_path_factory.mktemp("hostile")
    shutil.copytree(local, root / PREFIX)
    return root, local


@pytest.mark.parametrize("mode", ["shifted", "unlabelled", "ignored"])
def test_a_server_answering_other_bytes_fails_convert_and_verify(
    mode: str, served: tuple[Path, Path], cli: Any, tmp_path: Path
) -> None:
    root, local = served
    good = tmp_path / "good"
    assert cli("convert", local, good).rc == 0
    with hostile_http(root, mode) as base:
        url = f"{base}/{PREFIX}"
        assert cli("scan", url).rc == 0  # the scan's small reads are answered honestly
        result = cli("convert", url, tmp_path / "out")
        assert result.rc != 0, result.output
        assert "did not show that it returned bytes" in result.output
        assert "Traceback" not in result.output
        checked = cli("verify", url, good)
    assert checked.rc != 0, checked.output
    assert "OK" not in checked.stdout


def test_an_honest_server_is_read_and_verify_names_the_proof(
    served: tuple[Path, Path], cli: Any, tmp_path: Path
) -> None:
    root, _ = served
    with hostile_http(root, "honest") as base:
        url = f"{base}/{PREFIX}"
        assert cli("convert", url, tmp_path / "out").rc == 0
        checked = cli("verify", url, tmp_path / "out")
    assert checked.rc == 0, checked.output
    assert "ranges proven by Content-Range" in checked.output


@pytest.mark.parametrize("mode", ["drip", "silent"])
def test_a_dripping_or_silent_http_server_ends_within_the_bounds(
    mode: str, served: tuple[Path, Path], cli: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root, _ = served
    monkeypatch.setenv("ZI_REMOTE_STALL_TIMEOUT", "2")
    monkeypatch.setenv("ZI_REMOTE_DEADLINE", "4")
    with hostile_http(root, mode) as base:
        url = f"{base}/{PREFIX}"
        start = time.monotonic()
        result = cli("convert", url, tmp_path / "out", timeout=120)
        took = time.monotonic() - start
    assert result.rc != 0, result.output
    assert "timed out" in result.output.lower() or "within" in result.output, result.output
    assert base.split("//")[1] in result.output  # the URL is named
    assert "Traceback" not in result.output
    print(f"\n{mode}: ended after {took:.1f} s")


@pytest.mark.parametrize("scheme", ["gs", "az"])
def test_a_gs_or_az_store_dripping_its_answer_ends_at_the_deadline(
    scheme: str, request: pytest.FixtureRequest, cli: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    if scheme == "gs":
        url, _ = request.getfixturevalue("gs_demo")
        proxy = request.getfixturevalue("gs_server")[0]
    else:
        url, _ = request.getfixturevalue("az_demo")
        proxy = request.getfixturevalue("azurite")[0]
    monkeypatch.setenv("ZI_REMOTE_DEADLINE", "4")
    monkeypatch.setenv("ZI_REMOTE_RETRIES", "0")
    proxy.throttle.reset()
    # object GETs drip; listings (a query string, or Azure's `comp=list`) answer at once
    proxy.throttle.drip = lambda method, path: method == "GET" and "list" not in path
    try:
        start = time.monotonic()
        result = cli("scan", url, timeout=120)
        took = time.monotonic() - start
    finally:
        proxy.throttle.reset()
    assert result.rc != 0, result.output
    assert "within 4 s" in result.output, result.output
    assert url in result.output
    assert "Traceback" not in result.output
    print(f"\n{scheme} drip: ended after {took:.1f} s")


def test_an_http_server_pacing_its_body_ends_at_the_low_speed_bound(
    served: tuple[Path, Path], cli: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A byte a second, each within the stall timeout, the deadline an hour away: the low-speed bound ends
    it (the URL named, no traceback)."""
    root, _ = served
    monkeypatch.setenv("ZI_REMOTE_STALL_TIMEOUT", "2")
    monkeypatch.setenv("ZI_REMOTE_DEADLINE", "3600")
    monkeypatch.setenv("ZI_REMOTE_LOW_SPEED_TIME", "2")
    with hostile_http(root, "drip") as base:
        result = cli("convert", f"{base}/{PREFIX}", tmp_path / "out", timeout=120)
    assert result.rc != 0, result.output
    assert "slower than 1024 bytes a second" in result.output, result.output
    assert base.split("//")[1] in result.output
    assert "Traceback" not in result.output
