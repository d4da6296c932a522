"""`convert SRC s3://bucket/prefix --part I/N`, then the finishing run: N processes upload their shares side by
side (each staging in a folder of its own), the finishing run reuses every object they completed (told by the
listing and each object's metadata: nothing downloaded, nothing uploaded again) and writes the rest, the index
or `latest_universal` last; the prefix then holds byte for byte what one local run writes. A part that fails
removes only its own objects. Against moto's S3 server on localhost, behind tests/remote/proxy.py."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import pytest

from inspector.convert.bucket import plan_output
from inspector.convert.kinds import Request, get
from inspector.convert.options import ConvertOptions
from inspector.errors import InspectorError
from inspector.scan.scanner import scan
from tests.conftest import run_cli
from tests.remote.conftest import BUCKET, upload
from tests.remote.proxy import S3Proxy
from tests.remote.test_s3_parts import _tree, run_parts
from tests.remote.test_upload import _run, objects, open_uploads

pytestmark = pytest.mark.s3

LAST = {"weights": "model.safetensors.index.json", "model": "model.safetensors.index.json"}


def _url(what: str) -> str:
    return f"s3://{BUCKET}/parts-out/{what}-{uuid.uuid4().hex[:8]}"


def _record(proxy: S3Proxy) -> list[tuple[str, str]]:
    seen: list[tuple[str, str]] = []

    def fault(method: str, path: str) -> None:
        seen.append((method, unquote(path.split("?")[0])))
        return None

    proxy.throttle.fault = fault
    return seen


def _below(seen: list[tuple[str, str]], method: str, url: str) -> list[str]:
    """The names below `url` that requests of `method` went to, in order (parts of one upload once)."""
    prefix = "/" + url.removeprefix("s3://") + "/"
    out: list[str] = []
    for m, path in seen:
        if m == method and path.startswith(prefix) and (not out or out[-1] != path[len(prefix) :]):
            out.append(path[len(prefix) :])
    return out


@pytest.mark.parametrize(
    "kind, extra", [("weights", ["--shard-size", "1MB"]), ("universal", [])], ids=["weights", "universal"]
)
def test_three_parts_into_a_bucket_then_the_finish_equal_one_local_run(
    s3_demo: tuple[str, Path], proxy: S3Proxy, tmp_path: Path, kind: str, extra: list[str]
) -> None:
    src, local_src = s3_demo
    args = ["--format", kind, *extra]
    one = run_cli("convert", src, tmp_path / "one", *args)
    assert one.rc == 0, one.output
    one_fetched = proxy.throttle.bytes_out  # what one run reads of the bucket
    want = _tree(tmp_path / "one")
    out = _url(kind)
    run_parts([src, out, *args], 3)
    staged = objects_of(out)
    assert staged and set(staged) < set(want)  # each part published its share; no index, no latest
    last = LAST.get(kind, "latest_universal")
    assert last not in staged
    assert all(staged[name] == want[name] for name in staged)  # each object complete and right
    seen = _record(proxy)
    _zero(proxy)
    final = run_cli("convert", src, out, *args)
    assert final.rc == 0, final.output
    assert "Uploaded to" in final.stdout
    # nor rewritten from the source: the finish reads the scan's bytes and its own share's (measured: 0.9 of
    # 9.8 MB for weights, 5.1 of ~30 MB for universal), not the parts' shares again
    assert proxy.throttle.bytes_out < one_fetched / 2, (proxy.throttle.bytes_out, one_fetched)
    put, got = _below(seen, "PUT", out), _below(seen, "GET", out)
    assert not set(put) & set(staged)  # the parts' objects were not uploaded again ...
    assert not got  # ... nor downloaded: the listing and HEADs said enough
    assert set(put) == set(want) - set(staged) and put[-1] == last  # the rest, the index or latest last
    assert objects_of(out) == want  # byte for byte one local run's, nothing more
    if kind == "universal":  # a universal export records no source path: equal to the local copy's too
        assert run_cli("convert", local_src, tmp_path / "local", *args).rc == 0
        assert objects_of(out) == _tree(tmp_path / "local")
    assert open_uploads(_client(), out) == []
    checked = run_cli("verify", src, out)
    assert checked.rc == 0, checked.output


def test_a_trainer_run_in_parts_into_a_bucket_is_the_model_folder(
    s3_client: Any, demo: Any, proxy: S3Proxy, tmp_path: Path
) -> None:
    """`--format model` (the default): the parts upload the shards, the finishing run the config and
    tokenizer files beside them and the index; what one local run writes."""
    from tests.convert.kinds.hf import SIDE, trainer_run

    upload(s3_client, trainer_run(demo, tmp_path / "src"), "trainer-out/run")
    src = f"s3://{BUCKET}/trainer-out/run"
    args = ["--shard-size", "200KB"]
    assert run_cli("convert", src, tmp_path / "one", *args).rc == 0
    want = _tree(tmp_path / "one")
    out = _url("model")
    run_parts([src, out, *args], 3)
    staged = objects_of(out)
    assert len(staged) >= 2 and not set(SIDE) & set(staged)
    seen = _record(proxy)
    final = run_cli("convert", src, out, *args)
    assert final.rc == 0, final.output
    assert objects_of(out) == want and set(SIDE) <= want.keys()
    assert set(_below(seen, "PUT", out)) == set(want) - set(staged)


def test_a_failed_part_removes_only_its_objects_and_the_finish_writes_its_share(
    s3_demo: tuple[str, Path], proxy: S3Proxy, tmp_path: Path
) -> None:
    """Part 1 of 3 fails on its second shard's upload: its first shard is removed again, parts 0 and 2 keep
    theirs; the finishing run then uploads part 1's share and the index, and the prefix is one run's."""
    src, _ = s3_demo
    ckpt = scan(src)
    request = Request(ConvertOptions(shard_size=500_000))
    local = tmp_path / "one"
    _run(get("weights").plan(ckpt, request, str(local)))
    want = _tree(local)
    out = _url("failed")
    staging = str(tmp_path / "staging")

    def job(part: tuple[int, int] | None) -> Any:
        return plan_output(get("weights"), ckpt, request, out, staging, part)

    for i in (0, 2):
        _run(job((i, 3)), part=(i, 3))
    kept = objects_of(out)
    from inspector.convert.staging import part_indices

    ones = [job(None).plan.shards[k].filename for k in part_indices([s.file_bytes for s in job(None).plan.shards], (1, 3))]
    assert len(ones) >= 2 and not set(ones) & set(kept)
    prefix = "/" + out.removeprefix("s3://") + "/"

    def fail_second(method: str, path: str) -> tuple[int, str] | None:
        name = unquote(path.split("?")[0])[len(prefix) :]
        return (403, "AccessDenied") if method == "PUT" and name == ones[1] else None

    seen = _record(proxy)
    first = proxy.throttle.fault
    proxy.throttle.fault = lambda m, p: first(m, p) or fail_second(m, p)  # type: ignore[misc]
    with pytest.raises(InspectorError):
        _run(job((1, 3)), part=(1, 3))
    assert _below(seen, "PUT", out) == ones[:2]  # it had uploaded its first shard ...
    assert objects_of(out) == kept  # ... and removed it again; the other parts' objects stay
    assert open_uploads(_client(), out) == []
    proxy.throttle.fault = None
    seen = _record(proxy)
    report = _run(job(None))
    assert _below(seen, "PUT", out) == [*ones, "model.safetensors.index.json"]  # in file order, index last
    assert not _below(seen, "GET", out)
    assert objects_of(out) == want
    assert report.resumed_shards == len(kept)
    assert dict(report.files) == {name: len(data) for name, data in want.items()}  # sizes from the listing


def test_a_rerun_part_and_the_finish_reuse_objects_without_their_staging(
    s3_demo: tuple[str, Path], proxy: S3Proxy, tmp_path: Path
) -> None:
    """A part run again (a retried array task) skips what it completed; the finishing run on another machine
    (another staging folder: nothing local of the parts) reuses every object and uploads the index only."""
    src, _ = s3_demo
    ckpt = scan(src)
    request = Request(ConvertOptions(shard_size=1_000_000))
    out = _url("rerun")
    for i in range(2):
        job = plan_output(get("weights"), ckpt, request, out, str(tmp_path / f"node{i}"), (i, 2))
        _run(job, part=(i, 2))
    again = plan_output(get("weights"), ckpt, request, out, str(tmp_path / "node0"), (0, 2))
    seen = _record(proxy)
    report = _run(again, part=(0, 2))
    assert report.resumed_shards == len(report.files) > 0 and not _below(seen, "PUT", out)
    finish = plan_output(get("weights"), ckpt, request, out, str(tmp_path / "driver"))
    seen = _record(proxy)
    _run(finish)
    assert _below(seen, "PUT", out) == ["model.safetensors.index.json"] and not _below(seen, "GET", out)


def _zero(proxy: S3Proxy) -> None:
    """The proxy's request and byte counters at zero (its fault stays)."""
    with proxy.throttle.lock:
        proxy.throttle.requests = proxy.throttle.bytes_out = 0


def _client() -> Any:
    import boto3

    return boto3.client("s3")


def objects_of(url: str) -> dict[str, bytes]:
    return objects(_client(), url)
