"""Checkpoints read from az:// (Azurite), gs:// (obstore's GCS client against an XML-API stand-in) and http://
(fsspec): the same scan and the same converted bytes as from disk, only the ranges the plan needs fetched,
every object read by range, and clear refusals when the store is missing, denies or cannot be reached.
Servers: tests/remote/servers.py."""

from __future__ import annotations

import base64
import json
import socket
from pathlib import Path
from typing import Any

import pytest

from inspector.errors import EXIT_USAGE
from inspector.scan.json_view import checkpoint_json
from inspector.scan.scanner import scan
from tests.conftest import CliResult
from tests.remote.compare import assert_fetched_only_the_plan, assert_same_files
from tests.remote.proxy import S3Proxy
from tests.remote.servers import azurite_connection

pytestmark = pytest.mark.remote  # tox -e remote: servers on localhost, each test runs the CLI a few times

SECRET = base64.b64encode(b"zi-test-secret-never-printed-zi-test-secret-never-printed").decode()


def _clean(result: CliResult) -> None:
    assert "Traceback" not in result.output
    assert SECRET not in result.output


@pytest.fixture(params=["az", "gs", "http"])
def store(request: pytest.FixtureRequest) -> tuple[str, Path, S3Proxy]:
    """(URL, local root, counting proxy) of the demo on each store in turn."""
    if request.param == "az":
        url, local = request.getfixturevalue("az_demo")
        proxy = request.getfixturevalue("azurite")[0]
    elif request.param == "gs":
        url, local = request.getfixturevalue("gs_demo")
        proxy = request.getfixturevalue("gs_server")[0]
    else:
        url, local, proxy = request.getfixturevalue("http_demo")
    proxy.throttle.reset()
    yield url, local, proxy
    proxy.throttle.reset()


def test_scan_from_a_store_equals_the_local_scan(store: tuple[str, Path, S3Proxy]) -> None:
    url, local, _ = store
    remote = json.dumps(checkpoint_json(scan(url)))
    assert url in remote
    assert json.loads(remote.replace(url, str(local))) == checkpoint_json(scan(str(local)))


def test_convert_from_a_store_writes_the_local_bytes_reading_only_ranges_it_needs(
    store: tuple[str, Path, S3Proxy], cli: Any, tmp_path: Path
) -> None:
    url, local, proxy = store
    gets: list[str] = []
    ranged: list[str] = []
    proxy.throttle.fault = lambda method, path: gets.append(path) if method == "GET" else None
    proxy.throttle.fault_at = lambda path, first, length: ranged.append(path)
    remote = cli("convert", url, tmp_path / "remote")
    assert remote.rc == 0, remote.output
    fetched = proxy.throttle.bytes_out
    proxy.throttle.fault = proxy.throttle.fault_at = None
    assert cli("convert", local, tmp_path / "local").rc == 0
    assert_same_files(tmp_path / "remote", tmp_path / "local")
    # every object read by range: a GET with no query (not a listing) and no trailing slash (not a folder page)
    whole = [p for p in gets if "?" not in p and not p.endswith("/") and p not in ranged]
    assert not whole, whole[:3]
    need, total = assert_fetched_only_the_plan(cli, local, fetched)
    print(f"\n{url.split(':')[0]}: fetched {fetched:,} bytes for a plan of {need:,} ({total:,} on disk)")
    checked = cli("verify", url, tmp_path / "remote")
    assert checked.rc == 0, checked.output


# -- refusals ----------------------------------------------------------------------------------------------


def test_a_missing_container_or_bucket_is_named(
    cli: Any, az_demo: tuple[str, Path], gs_demo: tuple[str, Path]
) -> None:
    for url in ("az://no-such-container/run", "gs://no-such-bucket/run"):
        result = cli("scan", url)
        assert result.rc == EXIT_USAGE, result.output
        assert "does not exist" in result.output
        _clean(result)


def test_a_wrong_azure_key_is_a_clear_error_without_the_key(
    cli: Any, azurite: tuple[S3Proxy, int], az_demo: tuple[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AZURE_STORAGE_CONNECTION_STRING", azurite_connection(azurite[0].url, SECRET))
    monkeypatch.setenv("ZI_REMOTE_RETRIES", "1")
    result = cli("scan", az_demo[0])
    assert result.rc == EXIT_USAGE, result.output
    assert "Access denied" in result.output or "No credentials" in result.output
    _clean(result)


def test_an_azure_endpoint_that_refuses_connections_is_named(
    cli: Any, az_demo: tuple[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    with socket.socket() as s:  # bound, never listening
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}"
        monkeypatch.setenv("AZURE_STORAGE_CONNECTION_STRING", azurite_connection(dead, SECRET))
        monkeypatch.setenv("ZI_REMOTE_RETRIES", "1")
        result = cli("scan", az_demo[0])
    assert result.rc == EXIT_USAGE, result.output
    assert f"Cannot reach {dead}" in result.output
    _clean(result)


def test_an_http_folder_that_is_not_there_is_named(cli: Any, http_demo: tuple[str, Path, S3Proxy]) -> None:
    result = cli("scan", http_demo[0].replace("stage2/demo", "stage2/nothing-here"))
    assert result.rc == EXIT_USAGE, result.output
    assert "does not exist" in result.output
    _clean(result)


def test_the_azure_emulator_switch_reads_the_same_checkpoint(
    azurite: tuple[S3Proxy, int], az_demo: tuple[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """AZURE_STORAGE_USE_EMULATOR (obstore's development account and key) instead of a connection string."""
    url, local = az_demo
    monkeypatch.delenv("AZURE_STORAGE_CONNECTION_STRING")
    monkeypatch.setenv("AZURE_STORAGE_USE_EMULATOR", "true")
    monkeypatch.setenv("AZURITE_BLOB_STORAGE_URL", f"http://127.0.0.1:{azurite[1]}")
    remote = json.dumps(checkpoint_json(scan(url)))
    assert json.loads(remote.replace(url, str(local))) == checkpoint_json(scan(str(local)))
