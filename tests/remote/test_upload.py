"""Conversions whose OUT is an `s3://` prefix: every kind uploads exactly the bytes it writes locally; a failed,
cancelled or killed run leaves nothing visible and no open upload; objects are not overwritten unless asked;
a rerun resumes. Against moto's S3 server on localhost, behind tests/remote/proxy.py."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import uuid
from pathlib import Path
from typing import Any

import pytest

from inspector.convert.bucket import plan_output
from inspector.convert.executor import Report
from inspector.convert.kinds import Job, Request, get, names, of_output
from inspector.convert.options import ConvertOptions
from inspector.convert.root import OutputRoot
from inspector.convert.verify import VerifyResult
from inspector.demo.writer import DemoSpec
from inspector.errors import EXIT_USAGE, CancelledError, InspectorError, OutputError
from inspector.remote.upload import BucketDestination
from inspector.scan.scanner import scan
from tests.conftest import REPO_ROOT
from tests.convert.kinds.hf import offered_checkpoint
from tests.remote.conftest import BUCKET, SECRET
from tests.remote.proxy import Fault, S3Proxy

pytestmark = pytest.mark.s3

SMALL = DemoSpec(stage=2, world_size=2, dtype="bf16", params=60_000)
BIG = DemoSpec(
    stage=2, world_size=2, dtype="bf16", params=4_000_000
)  # 16 MB as fp32: 5 MiB parts, 6 MB shards


def _url(what: str) -> str:
    return f"s3://{BUCKET}/out/{what}-{uuid.uuid4().hex[:8]}"


def _prefix(url: str) -> str:
    return url.removeprefix(f"s3://{BUCKET}/") + "/"


def objects(client: Any, url: str) -> dict[str, bytes]:
    """Every object under the URL's prefix, by its name below it."""
    prefix = _prefix(url)
    found: dict[str, bytes] = {}
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=prefix):
        for obj in page.get("Contents", []):
            body = client.get_object(Bucket=BUCKET, Key=obj["Key"])["Body"].read()
            found[obj["Key"][len(prefix) :]] = body
    return found


def open_uploads(client: Any, url: str) -> list[str]:
    page = client.list_multipart_uploads(Bucket=BUCKET, Prefix=_prefix(url))
    return [u["Key"] for u in page.get("Uploads", [])]


def local_files(out: Path) -> dict[str, bytes]:
    return {
        p.relative_to(out).as_posix(): p.read_bytes()
        for p in out.rglob("*")
        if p.is_file() and not p.name.startswith(".")
    }


def hold_second_complete(holding: threading.Event, release: threading.Event) -> Fault:
    """A proxy fault: the second shard's CompleteMultipartUpload is held until `release` is set, then refused,
    so a run is caught between that shard's parts and its completion, deterministically (`holding` says
    it is)."""
    completes: list[str] = []

    def fault(method: str, path: str) -> tuple[int, str] | None:
        if method == "POST" and "uploadId" in path:
            completes.append(path)
            if len(completes) == 2:
                holding.set()
                release.wait(60)
                return (500, "InternalError")
        return None

    return fault


def _run(job: Job, **kwargs: Any) -> Report:
    reports = [ev for ev in job.run(**kwargs) if isinstance(ev, Report)]
    assert len(reports) == 1
    return reports[0]


def _record(proxy: S3Proxy) -> list[tuple[str, str]]:
    """Every request the proxy sees, as (method, path)."""
    seen: list[tuple[str, str]] = []

    def fault(method: str, path: str) -> None:
        seen.append((method, path))
        return None

    proxy.throttle.fault = fault
    return seen


def _writes(seen: list[tuple[str, str]]) -> list[str]:
    """The object paths written (PUT of an object or a part), without the query."""
    return [p.split("?")[0] for m, p in seen if m == "PUT"]


# -- every kind --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", names())
def test_every_kind_uploads_the_bytes_a_local_conversion_writes(
    kind: str, demo: Any, tmp_path: Path, s3_client: Any, proxy: S3Proxy
) -> None:
    ckpt = offered_checkpoint(kind, demo, tmp_path, SMALL)
    local = tmp_path / "local"
    _run(get(kind).plan(ckpt, Request(ConvertOptions()), str(local)))
    url = _url(kind)
    staging = tmp_path / "staging"
    job = plan_output(get(kind), ckpt, Request(ConvertOptions()), url, str(staging))
    job.check_output(overwrite=False)
    assert job.where.startswith(url)
    verdict = job.assess()
    assert verdict.upload_to == url and 0 < verdict.staged_bytes <= verdict.output_bytes
    report = _run(job)
    assert report.out_dir == job.where
    want = local_files(local)
    assert want
    assert objects(s3_client, url) == want  # byte for byte, nothing more, nothing less
    assert open_uploads(s3_client, url) == []
    assert not staging.exists() or not list(staging.iterdir())  # nothing staged is left behind
    found = of_output(url)
    assert found.name == kind
    result = [ev for ev in found.verify(ckpt, url) if isinstance(ev, VerifyResult)][-1]
    assert result.ok and result.checked > 0


def test_a_universal_export_goes_up_in_the_writers_order_with_latest_last(
    demo: Any, tmp_path: Path, s3_client: Any, proxy: S3Proxy
) -> None:
    """Its files are written by several threads, and published strictly one after the other: the small
    files, the model-states copies (first: one big file that must not run alone at the end), the tensor files
    in plan order, then `latest_universal`."""
    from urllib.parse import unquote

    ckpt = scan(str(demo(SMALL)))
    url = _url("order")
    job = plan_output(get("universal"), ckpt, Request(), url, str(tmp_path / "staging"))
    seen = _record(proxy)
    _run(job)
    plan = job.plan
    folder = plan.folder
    want = [
        f"{folder}/zero/optimizer_state.pt",
        *(f"{folder}/zero/{name}/step.pt" for name, _ in plan.step_params),
        *(f"{folder}/{name}" for _, name, _ in plan.copies),
        *(f"{folder}/{f.rel}" for f in plan.files),
        "latest_universal",
    ]
    put = [unquote(p).removeprefix("/" + BUCKET + "/" + _prefix(url)) for p in _writes(seen)]
    assert len(want) > 20 and put == want


def test_the_cli_uploads_by_multipart_in_file_order_and_names_the_bucket(
    s3_demo: tuple[str, Path],
    s3_client: Any,
    proxy: S3Proxy,
    cli: Any,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """fp32 shards of ~4 MB with 5 MiB parts: the larger shard goes up in two parts; the JSON events name the
    URL; `verify` reads the output back from the bucket."""
    _, local = s3_demo
    monkeypatch.setenv("ZI_S3_PART_MIB", "5")
    url = _url("cli")
    args = ("--format", "weights", "--dtype", "fp32", "--shard-size", "6MB")
    seen = _record(proxy)
    result = cli("convert", local, url, *args, "--progress", "json")
    assert result.rc == 0, result.output
    events = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    assert url in events[0]["out_dir"] and events[-1]["out_dir"] == url
    assert cli("convert", local, tmp_path / "local", *args).rc == 0
    want = local_files(tmp_path / "local")
    assert objects(s3_client, url) == want
    shards = sorted(n for n in want if n.endswith(".safetensors"))
    assert len(shards) >= 2
    written = _writes(seen)
    order = [next(s for s in shards if p.endswith("/" + s)) for p in written if p.endswith(".safetensors")]
    assert order == sorted(order) and set(order) == set(shards)  # one file after the other, in file order
    assert any("uploadId" in p for m, p in seen if m == "PUT")  # multipart parts
    assert written[-1].endswith("model.safetensors.index.json")  # the index last, after what it names
    proxy.throttle.reset()
    checked = cli("verify", local, url)
    assert checked.rc == 0, checked.output
    assert "OK" in checked.output


# -- nothing visible unless complete -----------------------------------------------------------------------


def _big_job(demo: Any, url: str, tmp_path: Path, shard_size: int) -> Job:
    ckpt = scan(str(demo(BIG)))
    opts = ConvertOptions(dtype="float32", shard_size=shard_size)
    return plan_output(get("weights"), ckpt, Request(opts), url, str(tmp_path / "staging"))


def test_a_cancelled_conversion_leaves_no_object_and_no_open_upload(
    demo: Any, s3_client: Any, proxy: S3Proxy, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Cancel arrives while the second shard's multipart upload is under way: it is aborted, and the shard
    already complete is removed again."""
    monkeypatch.setenv("ZI_S3_PART_MIB", "5")
    url = _url("cancel")
    cancel = threading.Event()
    parts: list[str] = []

    def second_upload(method: str, path: str) -> None:
        if method == "PUT" and "uploadId" in path:
            parts.append(path)
            if len({p.split("?")[0] for p in parts}) == 2:  # a part of the second file
                cancel.set()
        return None

    proxy.throttle.fault = second_upload
    job = _big_job(demo, url, tmp_path, 6_000_000)
    with pytest.raises(CancelledError):
        _run(job, cancel=cancel)
    assert cancel.is_set() and len({p.split("?")[0] for p in parts}) == 2
    proxy.throttle.reset()
    assert objects(s3_client, url) == {}
    assert open_uploads(s3_client, url) == []


def test_a_failed_upload_is_aborted_and_nothing_stays_visible(
    demo: Any, s3_client: Any, proxy: S3Proxy, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ZI_S3_PART_MIB", "5")
    url = _url("fail")
    completes: list[str] = []

    def refuse_second_complete(method: str, path: str) -> tuple[int, str] | None:
        if method == "POST" and "uploadId" in path:
            completes.append(path)
            return (403, "AccessDenied") if len(completes) == 2 else None
        return None

    proxy.throttle.fault = refuse_second_complete
    with pytest.raises(InspectorError, match="access denied"):
        _run(_big_job(demo, url, tmp_path, 6_000_000))
    proxy.throttle.reset()
    assert len(completes) == 2
    assert objects(s3_client, url) == {}
    assert open_uploads(s3_client, url) == []


def test_an_interrupt_mid_run_aborts_the_open_upload(
    demo: Any, s3_client: Any, proxy: S3Proxy, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ctrl-C (KeyboardInterrupt) raised while the second shard goes up: its upload is aborted and the
    first shard, complete, removed again, as on cancel."""
    monkeypatch.setenv("ZI_S3_PART_MIB", "5")
    url = _url("interrupt")
    real = BucketDestination._part
    calls: list[int] = []

    def interrupted(self: BucketDestination, *args: Any) -> Any:
        calls.append(1)
        if len(calls) == 3:  # the first part of the second shard (the first went up in two)
            self._slots.release()
            raise KeyboardInterrupt
        return real(self, *args)

    monkeypatch.setattr(BucketDestination, "_part", interrupted)
    with pytest.raises(KeyboardInterrupt):
        _run(_big_job(demo, url, tmp_path, 6_000_000))
    assert len(calls) >= 3  # the next part may start on another upload thread before the interrupt lands
    assert objects(s3_client, url) == {}
    assert open_uploads(s3_client, url) == []


# -- never overwriting what is there -----------------------------------------------------------------------


def test_an_existing_object_is_kept_unless_overwrite(
    s3_demo: tuple[str, Path], s3_client: Any, proxy: S3Proxy, cli: Any
) -> None:
    _, local = s3_demo
    url = _url("exists")
    key = _prefix(url) + "model.safetensors"
    s3_client.put_object(Bucket=BUCKET, Key=key, Body=b"the user's own file")
    result = cli("convert", local, url, "--format", "weights")
    assert result.rc == EXIT_USAGE, result.output
    assert "already holds model.safetensors" in result.output and "--overwrite" in result.output
    assert s3_client.get_object(Bucket=BUCKET, Key=key)["Body"].read() == b"the user's own file"
    assert cli("convert", local, url, "--format", "weights", "--overwrite").rc == 0
    assert s3_client.get_object(Bucket=BUCKET, Key=key)["Body"].read()[8:9] == b"{"  # a safetensors header


def test_an_object_appearing_during_the_run_is_not_overwritten(
    s3_demo: tuple[str, Path], s3_client: Any, proxy: S3Proxy, tmp_path: Path
) -> None:
    """The check found the key free; someone writes it before our upload: the conditional write refuses."""
    url = _url("race")
    key = _prefix(url) + "model.safetensors"
    planted: list[str] = []

    def plant(method: str, path: str) -> None:
        if method == "PUT" and path.split("?")[0].endswith("/model.safetensors") and not planted:
            planted.append(path)
            s3_client.put_object(Bucket=BUCKET, Key=key, Body=b"theirs")
        return None

    proxy.throttle.fault = plant
    ckpt = scan(str(s3_demo[1]))
    job = plan_output(get("weights"), ckpt, Request(ConvertOptions()), url, str(tmp_path / "staging"))
    with pytest.raises(OutputError, match="appeared while this run was writing it"):
        _run(job)
    proxy.throttle.reset()
    assert s3_client.get_object(Bucket=BUCKET, Key=key)["Body"].read() == b"theirs"


# -- names -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name", ["../escape.pt", "zero/../../escape.pt", "zero/\x1b[31m/fp32.pt", "a//b/../c"]
)
def test_a_hostile_name_cannot_leave_the_prefix(
    name: str, s3_client: Any, s3_proxy: S3Proxy, tmp_path: Path
) -> None:
    url = _url("hostile")
    dest = BucketDestination(url, "job", overwrite=False)
    with pytest.raises(OutputError):
        dest.key(name)
    root = OutputRoot(str(tmp_path / "staging"), dest=dest)
    try:
        with pytest.raises(OutputError, match=r"Unsafe|Refusing"):
            root.write_atomic(name, b"x")
        root.write_atomic("zero/p/fp32.pt", b"fine")  # a plain name goes up, below the prefix
    finally:
        root.release(ok=True)
    keys = [o["Key"] for o in s3_client.list_objects_v2(Bucket=BUCKET).get("Contents", [])]
    # test_s3.py plants such keys below hostile/ in the same session's bucket, to read them: not uploads
    assert not [k for k in keys if ("escape" in k or "\x1b" in k) and not k.startswith("hostile/")]
    assert objects(s3_client, url) == {"zero/p/fp32.pt": b"fine"}


# -- credentials -------------------------------------------------------------------------------------------


def test_bad_credentials_are_a_clear_error_without_the_secret(
    s3_demo: tuple[str, Path], proxy: S3Proxy, cli: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, local = s3_demo
    url = _url("denied")
    proxy.throttle.fault = lambda method, path: (403, "InvalidAccessKeyId")
    result = cli("convert", local, url, "--format", "weights")
    assert result.rc == EXIT_USAGE, result.output
    assert "access denied (InvalidAccessKeyId)" in result.output and "s3:PutObject" in result.output
    assert SECRET not in result.output and "Traceback" not in result.output
    proxy.throttle.reset()
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    result = cli("convert", local, url, "--format", "weights")
    assert result.rc == EXIT_USAGE, result.output
    assert "No credentials to write" in result.output and "Traceback" not in result.output


# -- resume ------------------------------------------------------------------------------------------------


def test_a_rerun_keeps_the_objects_this_job_finished(
    s3_demo: tuple[str, Path], s3_client: Any, proxy: S3Proxy, cli: Any, tmp_path: Path
) -> None:
    """The first run completes; the index and the last shard are then lost (as after a kill before them):
    the same command uploads only those two, and the output equals a fresh conversion."""
    _, local = s3_demo
    url = _url("resume")
    args = ("--format", "weights", "--shard-size", "1MB")
    assert cli("convert", local, url, *args).rc == 0
    first = objects(s3_client, url)
    shards = sorted(n for n in first if n.endswith(".safetensors"))
    assert len(shards) >= 3
    for name in (shards[-1], "model.safetensors.index.json"):
        s3_client.delete_object(Bucket=BUCKET, Key=_prefix(url) + name)
    seen = _record(proxy)
    again = cli("convert", local, url, *args, "--progress", "json")
    assert again.rc == 0, again.output
    written = sorted(p.rsplit("/", 1)[-1] for p in _writes(seen))
    assert written == sorted([shards[-1], "model.safetensors.index.json"])
    done = json.loads(again.stdout.splitlines()[-1])
    assert done["resumed_files"] == len(shards) - 1
    proxy.throttle.reset()
    assert objects(s3_client, url) == first


def test_a_killed_run_leaves_an_open_upload_that_the_rerun_aborts(
    demo: Any, s3_client: Any, proxy: S3Proxy, cli: Any, tmp_path: Path
) -> None:
    """kill -9 in the middle of a multipart upload: no object is visible, the upload stays open (the
    lifecycle rule's case); the same command aborts it, keeps the finished shards and completes."""
    local = demo(BIG)
    url = _url("killed")
    args = ["--format", "weights", "--dtype", "fp32", "--shard-size", "6MB"]
    holding, killed = threading.Event(), threading.Event()
    proxy.throttle.fault = hold_second_complete(holding, killed)  # held until the process is dead
    env = dict(os.environ, ZI_S3_PART_MIB="5", AWS_MAX_ATTEMPTS="1")
    cmd = [sys.executable, "-m", "inspector", "convert", str(local), url, *args]
    child = subprocess.Popen(
        cmd, cwd=REPO_ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        assert holding.wait(60), "the second shard never completed its parts"
    finally:
        child.kill()
        child.wait()
        killed.set()
    proxy.throttle.reset()
    finished = objects(s3_client, url)
    assert finished and open_uploads(s3_client, url), "the run was not caught between two shards"
    assert list(finished) == ["model-00001-of-00003.safetensors"]
    seen = _record(proxy)
    rerun = subprocess.run(cmd, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert rerun.returncode == 0, rerun.stdout + rerun.stderr
    assert open_uploads(s3_client, url) == []
    assert not [p for p in _writes(seen) if any(p.endswith("/" + n) for n in finished)]
    assert cli("convert", local, tmp_path / "local", *args).rc == 0
    proxy.throttle.reset()
    assert objects(s3_client, url) == local_files(tmp_path / "local")


def test_ctrl_c_in_the_cli_aborts_the_open_upload_and_removes_the_finished_shard(
    demo: Any, s3_client: Any, proxy: S3Proxy
) -> None:
    """SIGINT while the second shard's upload is completing: exit 130, no object, no open upload."""
    url = _url("sigint")
    holding, released = threading.Event(), threading.Event()
    proxy.throttle.fault = hold_second_complete(holding, released)
    env = dict(os.environ, ZI_S3_PART_MIB="5", AWS_MAX_ATTEMPTS="1")
    args = ["--format", "weights", "--dtype", "fp32", "--shard-size", "6MB"]
    cmd = [sys.executable, "-m", "inspector", "convert", str(demo(BIG)), url, *args]
    child = subprocess.Popen(cmd, cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        assert holding.wait(60), "the second shard never completed its parts"
        assert objects(s3_client, url) and open_uploads(s3_client, url)  # one shard up, one open
        child.send_signal(signal.SIGINT)
        out, _ = child.communicate(timeout=60)
    finally:
        released.set()
        if child.poll() is None:
            child.kill()
    assert child.returncode == 130, out
    assert b"Interrupted" in out and b"Traceback" not in out
    proxy.throttle.reset()
    assert objects(s3_client, url) == {}
    assert open_uploads(s3_client, url) == []


def test_verify_refuses_nothing_in_the_bucket(s3_client: Any, s3_demo: tuple[str, Path], cli: Any) -> None:
    result = cli("verify", s3_demo[1], _url("empty"))
    assert result.rc != 0 and "Traceback" not in result.output


@pytest.mark.asyncio
async def test_the_app_converts_into_a_bucket(
    s3_demo: tuple[str, Path], s3_client: Any, s3_proxy: S3Proxy, tmp_path: Path
) -> None:
    """OUT typed as an s3:// URL in the app: its child converts and uploads, as the CLI does."""
    from dataclasses import replace

    from inspector.tui.app import make_app
    from tests.conftest import run_cli
    from tests.tui.conftest import converted, scanned

    _, local = s3_demo
    url = _url("app")
    assert run_cli("convert", local, tmp_path / "one", "--format", "weights").rc == 0
    app = make_app(path=str(local), out_dir=url, live_meters=False)
    async with app.run_test(size=(120, 36)) as pilot:
        await scanned(pilot)
        app.export = replace(app.export, format="weights")
        assert await converted(pilot) == "done"
    assert objects(s3_client, url) == local_files(tmp_path / "one")
