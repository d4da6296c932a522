"""Checkpoints read straight from a bucket: the same answers as from disk, and clear refusals when the store
fails or lies. Against moto's real S3 server on localhost, behind tests/remote/proxy.py."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from inspector.convert.options import CHUNK_ELEMS
from inspector.convert.plan import PIPELINE_DEPTH, REMOTE_DEPTH, REMOTE_SPLIT
from inspector.convert.preflight import REMOTE_CLIENT_RSS
from inspector.errors import EXIT_DAMAGED, EXIT_USAGE, InspectorError
from inspector.remote.source import StoreSource as S3Source
from inspector.scan.json_view import checkpoint_json
from inspector.scan.scanner import scan
from tests.conftest import REPO_ROOT, CliResult
from tests.remote.compare import assert_fetched_only_the_plan, assert_same_files
from tests.remote.conftest import BUCKET, SECRET, SPEC, upload
from tests.remote.proxy import S3Proxy

pytestmark = pytest.mark.s3  # tox -e s3: each test runs the CLI a few times, too slow for the quick unit run


def _as_local(text: str, url: str, local: Path) -> str:
    return text.replace(url, str(local))


def _clean(result: CliResult) -> None:
    """A user error: no traceback, no secret, nothing from botocore's internals."""
    assert "Traceback" not in result.output
    assert SECRET not in result.output


@pytest.fixture(params=["s3_demo", "s3_demo3"])
def either(request: pytest.FixtureRequest) -> tuple[str, Path]:
    """Each demo in turn: stage 2 on 2 ranks, stage 3 on 4."""
    found: tuple[str, Path] = request.getfixturevalue(request.param)
    return found


def test_scan_from_a_bucket_equals_the_local_scan(either: tuple[str, Path]) -> None:
    url, local = either
    remote = json.dumps(checkpoint_json(scan(url)))
    assert url in remote
    assert json.loads(_as_local(remote, url, local)) == checkpoint_json(scan(str(local)))


def test_a_tag_folder_url_scans_like_the_local_tag_folder(s3_demo: tuple[str, Path]) -> None:
    url, local = s3_demo
    tag = next(p.name for p in local.iterdir() if p.is_dir())
    remote = json.dumps(checkpoint_json(scan(f"{url}/{tag}/")))  # a trailing slash, as users paste it
    assert json.loads(_as_local(remote, url, local)) == checkpoint_json(scan(str(local / tag)))


def test_convert_from_a_bucket_writes_the_local_bytes_reading_only_what_it_needs(
    either: tuple[str, Path], proxy: S3Proxy, cli: Any, tmp_path: Path
) -> None:
    url, local = either
    remote = cli("convert", url, tmp_path / "remote")
    assert remote.rc == 0, remote.output
    fetched = proxy.throttle.bytes_out
    assert cli("convert", local, tmp_path / "local").rc == 0
    assert_same_files(tmp_path / "remote", tmp_path / "local")
    assert_fetched_only_the_plan(cli, local, fetched)
    checked = cli("verify", url, tmp_path / "remote")  # every output byte against the bucket's
    assert checked.rc == 0, checked.output


def test_a_universal_export_from_a_bucket_equals_the_local_one(
    s3_demo: tuple[str, Path], cli: Any, tmp_path: Path
) -> None:
    url, local = s3_demo
    assert cli("convert", url, tmp_path / "remote", "--format", "universal").rc == 0
    assert cli("convert", local, tmp_path / "local", "--format", "universal").rc == 0
    files = sorted(p.relative_to(tmp_path / "local") for p in (tmp_path / "local").rglob("*") if p.is_file())
    assert len(files) > 10
    assert files == sorted(
        p.relative_to(tmp_path / "remote") for p in (tmp_path / "remote").rglob("*") if p.is_file()
    )
    for rel in files:
        assert (tmp_path / "remote" / rel).read_bytes() == (tmp_path / "local" / rel).read_bytes(), rel
    checked = cli("verify", url, tmp_path / "remote")
    assert checked.rc == 0, checked.output


def test_a_read_failing_mid_convert_stops_it_and_leaves_no_partial_output(
    s3_demo: tuple[str, Path], proxy: S3Proxy, cli: Any, tmp_path: Path
) -> None:
    """The failure of a read started ahead (the chunk queued while its bytes are still coming) reaches the
    converter like any read error: a clear message, a non-zero exit, the partial shard removed."""
    url, _ = s3_demo
    data_reads: list[
        int
    ] = []  # the scan reads 64 KiB blocks and a zip tail; tensor data comes in larger parts

    def deny_data(path: str, first: int, length: int) -> tuple[int, str] | None:
        if length < 256 << 10:
            return None
        data_reads.append(first)
        return (403, "AccessDenied") if len(data_reads) > 3 else None  # a few chunks through, then refused

    proxy.throttle.fault_at = deny_data
    out = tmp_path / "out"
    result = cli("convert", url, out)
    assert result.rc == EXIT_USAGE, result.output
    assert "Access denied" in result.output
    _clean(result)
    assert len(data_reads) > 3  # it failed while converting, not while scanning
    assert not [p.name for p in out.rglob("*") if p.suffix == ".safetensors" or ".tmp" in p.name]


def test_health_from_a_bucket_equals_local(s3_demo: tuple[str, Path], cli: Any) -> None:
    url, local = s3_demo
    remote, here = cli("health", url, "--json"), cli("health", local, "--json")
    assert remote.rc == here.rc == 0, remote.output
    a, b = json.loads(_as_local(remote.stdout, url, local)), json.loads(here.stdout)
    for key in ("seconds", "threads"):  # how the run went, not what it found: a store gets more workers
        a.pop(key), b.pop(key)
    assert a == b


def test_preflight_reads_a_bucket(s3_demo: tuple[str, Path], cli: Any) -> None:
    url, local = s3_demo
    remote, here = cli("preflight", url, "--json"), cli("preflight", local, "--json")
    assert remote.rc == here.rc == 0, remote.output
    keys = ("output_bytes", "read_bytes")
    a, b = json.loads(remote.stdout), json.loads(here.stdout)
    assert [a[k] for k in keys] == [b[k] for k in keys]
    # the store's client, and other chunk buffers: more, smaller chunks in flight (plan.REMOTE_DEPTH,
    # REMOTE_SPLIT), so at most all of those more and at least all of the local ones fewer
    extra = a["predicted_peak_rss_bytes"] - b["predicted_peak_rss_bytes"] - REMOTE_CLIENT_RSS
    assert -PIPELINE_DEPTH * 2 * 4 * CHUNK_ELEMS <= extra <= REMOTE_DEPTH * 2 * 4 * CHUNK_ELEMS // REMOTE_SPLIT
    assert extra != 0  # this small model's buffers are its largest tensor: 8 of them from the store, not 3


# -- hostile names -----------------------------------------------------------------------------------------


def test_keys_that_are_no_plain_names_are_never_listed_or_opened(
    s3_client: Any, s3_demo: tuple[str, Path]
) -> None:
    url, local = s3_demo
    tag = f"hostile/run/{json.loads(json.dumps(checkpoint_json(scan(str(local)))))['tag']}"
    upload(s3_client, local, "hostile/run")
    planted = [
        f"{tag}/../../escape.pt",
        f"{tag}/\x1b[31mzero_pp_rank_9_mp_rank_00_optim_states.pt",
        f"{tag}//x",
    ]
    for key in planted:
        s3_client.put_object(Bucket=BUCKET, Key=key, Body=b"PK\x03\x04 not a checkpoint")
    listed = {o["Key"] for o in s3_client.list_objects_v2(Bucket=BUCKET, Prefix=tag)["Contents"]}
    assert set(planted) <= listed  # the store really holds them, unnormalised

    hostile = f"s3://{BUCKET}/hostile/run"  # a prefix never listed before: no listing of it is cached
    got = json.loads(json.dumps(checkpoint_json(scan(hostile))).replace(hostile, url))
    assert got == checkpoint_json(scan(url))  # as if the planted keys were not there
    src = S3Source.at(hostile, "checkpoint")
    assert sorted(src.listdir(f"{hostile}/{tag.split('/')[-1]}")) == sorted(
        p.name for p in (local / tag.split("/")[-1]).iterdir()
    )
    for bad in (f"{hostile}/{tag.split('/')[-1]}/../../escape.pt", f"s3://{BUCKET}/stage2/demo/latest"):
        with pytest.raises(InspectorError, match="leads outside"):
            src.open_handle(bad)


def test_a_url_with_dot_segments_is_refused(cli: Any, s3_proxy: S3Proxy) -> None:
    result = cli("scan", f"s3://{BUCKET}/stage2/demo/../demo")
    assert result.rc == EXIT_USAGE
    assert "not a plain object path" in result.output
    _clean(result)


# -- a store that lies or fails ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("listed", "words"),
    [
        pytest.param(lambda n: 1 << 62, ("declares a size no object can have",), id="no-object-can-have"),
        pytest.param(lambda n: n + 4096, ("did not return the", "past the listed size"), id="past-the-object"),
    ],
)
def test_a_listed_size_the_object_does_not_have_is_a_clear_error(
    s3_demo: tuple[str, Path], proxy: S3Proxy, cli: Any, listed: Callable[[int], int], words: tuple[str, ...]
) -> None:
    """The rank folder's listing (`latest` read right would say another thing) gives each object `listed`
    bytes instead of its own: refused as damaged, in words, whether no object could be that large or the
    reads come up short."""
    url, _ = s3_demo
    proxy.throttle.rewrite = lambda method, path, body: (
        re.sub(rb"<Size>(\d+)</Size>", lambda m: b"<Size>%d</Size>" % listed(int(m.group(1))), body)
        if "global_step" in path
        else body
    )
    result = cli("scan", url)
    assert result.rc == EXIT_DAMAGED, result.output
    assert any(w in result.output for w in words), result.output
    _clean(result)


def test_access_denied_is_a_clear_error(s3_demo: tuple[str, Path], proxy: S3Proxy, cli: Any) -> None:
    proxy.throttle.fault = lambda method, path: (403, "AccessDenied")
    result = cli("scan", s3_demo[0])
    assert result.rc == EXIT_USAGE
    assert "Access denied" in result.output and "s3:GetObject" in result.output
    _clean(result)


def test_listing_allowed_but_reading_denied_is_not_called_a_damaged_file(
    s3_demo: tuple[str, Path], proxy: S3Proxy, cli: Any
) -> None:
    """A common policy mistake (s3:ListBucket without s3:GetObject): the answer names the permission, not
    `latest` or a rank file as if they were broken."""
    proxy.throttle.fault = lambda method, path: None if "list-type=2" in path else (403, "AccessDenied")
    result = cli("scan", s3_demo[0])
    assert result.rc == EXIT_USAGE, result.output
    assert "Access denied" in result.output and "s3:GetObject" in result.output
    assert "Unsafe tag" not in result.output and "Damaged" not in result.output
    _clean(result)


def test_a_body_cut_off_midway_is_fetched_again(s3_demo: tuple[str, Path], proxy: S3Proxy) -> None:
    """botocore retries a request that fails, not a body that breaks off after the headers: ours does."""
    url, local = s3_demo
    cuts: list[str] = []

    def first_data_read(method: str, path: str) -> bool:
        cut = method == "GET" and "optim_states" in path and not cuts
        if cut:
            cuts.append(path)
        return cut

    proxy.throttle.cut = first_data_read
    name = next(p for p in sorted(local.rglob("*optim_states.pt")))
    rel = name.relative_to(local).as_posix()
    handle = S3Source.at(url).open_handle(f"{url}/{rel}")
    want = name.read_bytes()[1000 : 1000 + (3 << 20)]
    assert handle.pread(3 << 20, 1000) == want
    assert cuts  # the cut really happened, and the read still returned the right bytes


def test_small_reads_come_from_a_bounded_cache_and_match_the_file(s3_demo: tuple[str, Path]) -> None:
    """The scan's small reads go through 64 KiB blocks: any offset and length, across block edges, gives the
    file's bytes, and the cache never holds more than its limit."""
    import random

    from inspector.remote.ranged import BLOCK, SMALL
    from inspector.remote.store import CACHE_BLOCKS

    url, local = s3_demo
    name = next(p for p in sorted(local.rglob("*optim_states.pt")))
    data = name.read_bytes()
    handle = S3Source.at(url).open_handle(f"{url}/{name.relative_to(local).as_posix()}")
    rng = random.Random(19)
    spots = [(BLOCK - 5, 10), (len(data) - 7, 30), (0, SMALL), (2 * BLOCK - 1, SMALL)]
    spots += [(rng.randrange(len(data)), rng.randrange(1, SMALL + 1)) for _ in range(200)]
    for offset, n in spots:
        assert handle.pread(n, offset) == data[offset : offset + n], (offset, n)
    assert len(handle.store.cache) <= CACHE_BLOCKS


def test_an_object_rewritten_while_open_is_refused_not_mixed(s3_client: Any, s3_proxy: S3Proxy) -> None:
    """Every GET carries the listed ETag (If-Match): bytes of a newer save never mix into an older one's."""
    s3_client.put_object(Bucket=BUCKET, Key="rewritten/run/file.pt", Body=b"a" * 200_000)
    handle = S3Source.at(f"s3://{BUCKET}/rewritten/run").open_handle(f"s3://{BUCKET}/rewritten/run/file.pt")
    assert handle.pread(10, 0) == b"a" * 10
    s3_client.put_object(Bucket=BUCKET, Key="rewritten/run/file.pt", Body=b"b" * 200_000)
    with pytest.raises(InspectorError, match="changed while it was read"):
        handle.pread(100_000, 100_000)


def test_throttling_is_retried_then_explained(
    s3_demo: tuple[str, Path], proxy: S3Proxy, cli: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    url, _ = s3_demo
    seen: list[str] = []

    def once(method: str, path: str) -> tuple[int, str] | None:
        seen.append(path)
        return (503, "SlowDown") if len(seen) == 1 else None

    proxy.throttle.fault = once
    assert cli("scan", url).rc == 0  # the first request refused, retried with backoff, then answered
    assert len(seen) > 1
    proxy.throttle.fault = lambda method, path: (503, "SlowDown")
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "2")
    result = cli("scan", url)
    assert result.rc == EXIT_USAGE
    assert "kept refusing requests (SlowDown)" in result.output
    _clean(result)


def test_an_object_gone_after_listing_is_a_finding_on_that_file(
    s3_demo: tuple[str, Path], proxy: S3Proxy, cli: Any
) -> None:
    """Deleted between the listing and the read (another job pruning checkpoints): that rank file is
    reported unreadable, as a vanished local file is, and the scan says the checkpoint is damaged."""
    proxy.throttle.fault = lambda method, path: (
        (404, "NoSuchKey") if method == "GET" and "rank_1_mp_rank_00_optim" in path else None
    )
    result = cli("scan", s3_demo[0], "--json")
    assert result.rc == EXIT_DAMAGED, result.output
    found = [f for f in json.loads(result.stdout)["findings"] if f["code"] == "unreadable"]
    assert len(found) == 1 and "rank_1_mp_rank_00_optim" in found[0]["file"]
    assert "gone" in found[0]["message"]


def test_a_missing_bucket_or_prefix_is_named(cli: Any, s3_proxy: S3Proxy) -> None:
    result = cli("scan", "s3://no-such-bucket/run")
    assert result.rc == EXIT_USAGE and "bucket does not exist" in result.output
    _clean(result)
    result = cli("scan", f"s3://{BUCKET}/stage2/nothing-here")
    assert result.rc == EXIT_USAGE and "does not exist" in result.output
    _clean(result)


def test_no_credentials_is_a_clear_error(
    cli: Any, s3_proxy: S3Proxy, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    result = cli("scan", f"s3://{BUCKET}/stage2/demo")
    assert result.rc == EXIT_USAGE
    assert "No credentials" in result.output
    _clean(result)


def test_an_endpoint_that_refuses_connections_is_named(
    cli: Any, s3_proxy: S3Proxy, monkeypatch: pytest.MonkeyPatch
) -> None:
    import socket

    with socket.socket() as s:  # a port nothing listens on: bound, never listening
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}"
        monkeypatch.setenv("AWS_ENDPOINT_URL", dead)
        monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")
        result = cli("scan", f"s3://{BUCKET}/stage2/demo")
    assert result.rc == EXIT_USAGE
    assert f"Cannot reach {dead}" in result.output
    _clean(result)


def test_local_paths_never_import_the_client(demo: Any) -> None:
    """boto3 is the optional `s3` extra: a local scan must not need it, so it must not import it."""
    code = (
        "import sys; from inspector.scan.scanner import scan\n"
        f"scan({str(demo(SPEC))!r})\n"
        "assert not [m for m in sys.modules if m.startswith(('boto3', 'botocore'))], 'client imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO_ROOT, timeout=60)


@pytest.mark.asyncio
async def test_the_app_opens_a_checkpoint_in_a_bucket(s3_demo: tuple[str, Path], tmp_path: Path) -> None:
    """`zero-inspector s3://…`: the app scans the bucket, its Health tab reads it, and `c` converts it (the
    child reaches the bucket with the same environment) into files equal to converting the local copy."""
    from inspector.health import run_check
    from inspector.tui.app import make_app
    from tests.conftest import run_cli
    from tests.tui.conftest import converted, scanned, wait_for

    url, local = s3_demo
    out, one = tmp_path / "app", tmp_path / "one"
    assert run_cli("convert", local, one, "--format", "weights").rc == 0
    app = make_app(path=url, out_dir=str(out), live_meters=False)
    async with app.run_test(size=(120, 36)) as pilot:
        await scanned(pilot)
        assert app.ckpt is not None and app.ckpt.root == url
        await pilot.press("h")
        pane = app.main.health_pane
        await wait_for(pilot, lambda: pane.report is not None and not pane.running, "the health pass")
        truth = run_check(scan(str(local)))
        assert {(r.name, r.source): r.stats for r in pane.report.rows} == {
            (r.name, r.source): r.stats for r in truth.rows
        }
        app.export = replace(app.export, format="weights")
        assert await converted(pilot) == "done"
    assert_same_files(out, one)  # the safetensors bytes; an index (none for one shard) would differ in paths
