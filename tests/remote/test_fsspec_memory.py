"""Any fsspec protocol as a source, in process (fsspec's `memory://`, no server: part of the quick run when
fsspec is installed), and the URL rules every store shares."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from inspector.convert.reader import FilePool, read_tensor
from inspector.errors import InspectorError, NotACheckpointError, StoreError
from inspector.remote.backend import split_url
from inspector.remote.cloud import connection_string
from inspector.scan.json_view import checkpoint_json
from inspector.scan.scanner import scan
from tests.conftest import REPO_ROOT
from tests.remote.servers import SPEC


@pytest.fixture(scope="module")
def memory_demo(demo: Any) -> tuple[str, Path]:
    fsspec = pytest.importorskip("fsspec")
    local = demo(SPEC)
    fs = fsspec.filesystem("memory")
    for path in sorted(local.rglob("*")):
        if path.is_file():
            fs.pipe(f"memory://zi-demo/run/{path.relative_to(local).as_posix()}", path.read_bytes())
    return "memory://zi-demo/run", local


def test_scan_through_fsspec_equals_the_local_scan(memory_demo: tuple[str, Path]) -> None:
    url, local = memory_demo
    remote = json.dumps(checkpoint_json(scan(url)))
    assert json.loads(remote.replace(url, str(local))) == checkpoint_json(scan(str(local)))


def test_tensors_read_through_fsspec_are_the_local_ones_and_only_their_ranges_are_fetched(
    memory_demo: tuple[str, Path],
) -> None:
    import numpy as np

    from inspector.remote.store import store_for

    url, local = memory_demo
    there, here = scan(url), scan(str(local))
    store = store_for("memory", "zi-demo")
    names = [t.name for t in here.tensors][:6]
    before = store.fetched
    with FilePool(there.source) as pool:
        for name in names:
            np.testing.assert_array_equal(read_tensor(there, name, pool=pool), read_tensor(here, name))
    need = sum(s.nbytes for name in names for s in here.tensor(name).segments)
    assert need <= store.fetched - before <= need + 64 * (64 << 10)  # the ranges, plus a few cached blocks


def test_names_that_are_no_plain_names_are_never_listed(memory_demo: tuple[str, Path]) -> None:
    import fsspec

    from inspector.remote.roots import source_at

    fs = fsspec.filesystem("memory")
    fs.pipe("memory://zi-hostile/run/ok.json", b"{}")
    fs.pipe("memory://zi-hostile/run/\x1b[31mred.pt", b"PK")
    fs.pipe("memory://zi-hostile/run/a\\b.pt", b"PK")
    assert source_at("memory://zi-hostile/run").listdir() == ["ok.json"]


@pytest.mark.parametrize(
    "url",
    [
        "file:///etc/passwd",  # a local path goes through the confined local source, not fsspec
        "simplecache::s3://b/run",  # a wrapper that caches onto the disk
        "http://user:pw@127.0.0.1:1/run",  # credentials in the URL
        "memory://b/run/../other",
        "memory://b/run?x=1",
        "s3://Not_A_Bucket/run",
    ],
)
def test_urls_that_are_no_plain_store_paths_are_refused(url: str) -> None:
    with pytest.raises(NotACheckpointError) as exc:
        split_url(url)
    assert "pw@" not in str(exc.value)


def test_a_missing_client_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    from inspector.remote.store import store_for

    monkeypatch.setitem(sys.modules, "obstore", None)  # import obstore -> ImportError
    monkeypatch.setitem(sys.modules, "obstore.store", None)  # also when a gs:// test imported it first
    with pytest.raises(StoreError, match=r"zero-inspector\[gcs\]"):
        store_for("gs", "zi-no-client")
    with pytest.raises(StoreError, match=r"zero-inspector\[azure\]"):
        store_for("az", "zi-no-client")


def test_an_unknown_protocol_is_a_clear_error() -> None:
    pytest.importorskip("fsspec")
    with pytest.raises(InspectorError, match="knows no nosuchproto://"):
        scan("nosuchproto://bucket/run")


def test_an_azure_connection_string_becomes_obstore_configuration() -> None:
    got = connection_string(
        "DefaultEndpointsProtocol=https;AccountName=acct;AccountKey=a2V5;EndpointSuffix=core.windows.net"
    )
    assert got == {
        "account_name": "acct",
        "account_key": "a2V5",
        "endpoint": "https://acct.blob.core.windows.net",
    }
    assert connection_string("UseDevelopmentStorage=true") == {"use_emulator": True}
    got = connection_string("AccountName=a;AccountKey=k;BlobEndpoint=http://127.0.0.1:1/a")
    assert got["endpoint"] == "http://127.0.0.1:1/a"


def test_local_paths_never_import_a_store_client(demo: Any) -> None:
    """Each client is an optional extra: a local scan must not need any, so it must not import any."""
    code = (
        "import sys; from inspector.scan.scanner import scan\n"
        f"scan({str(demo(SPEC))!r})\n"
        "assert not [m for m in sys.modules if m.split('.')[0] in ('boto3', 'obstore', 'fsspec')], 'imported'\n"
        # remote.roots decides local-or-store once, for every root; it loads no store code for a local one
        "assert not [m for m in sys.modules if m.startswith('inspector.remote.') and m != 'inspector.remote.roots'], "
        "'store code imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO_ROOT, timeout=60)


def test_a_protocol_whose_client_hides_the_range_it_returned_is_refused(
    memory_demo: tuple[str, Path],
) -> None:
    """A client that cannot show which bytes it returned (here a memory file system under another name,
    standing for hf://, gcs://, sftp://) is refused for ranged reads, not trusted."""
    fsspec = pytest.importorskip("fsspec")
    from fsspec.implementations.memory import MemoryFileSystem

    class Opaque(MemoryFileSystem):
        protocol = "ziopaque"

    fsspec.register_implementation("ziopaque", Opaque, clobber=True)
    fs = fsspec.filesystem("ziopaque")
    for path in sorted(memory_demo[1].rglob("*")):
        if path.is_file():
            fs.pipe(
                f"ziopaque://zi-demo/run/{path.relative_to(memory_demo[1]).as_posix()}", path.read_bytes()
            )
    with pytest.raises(StoreError, match="cannot prove that the store returned the byte range"):
        scan("ziopaque://zi-demo/run")
