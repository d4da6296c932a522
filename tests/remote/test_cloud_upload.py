"""Conversions whose OUT is a `gs://` or `az://` prefix (obstore): the bytes a local conversion writes, by
multipart for a large file; a cancelled run leaves nothing visible and no open upload; another's object is
kept unless --overwrite; a rerun reuses only what it can prove. Against Azurite (az://) and moto standing in
for GCS's XML API (gs://), each behind tests/remote/proxy.py (tests/remote/servers.py).

moto speaks S3, not GCS: it ignores GCS's `x-goog-if-generation-match` and `x-goog-meta-*` headers, so the
conditional create and the metadata a rerun reuses by are tested on Azurite, which implements both."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from contextlib import suppress
from pathlib import Path
from typing import Any

import pytest

from inspector.convert.bucket import plan_output
from inspector.convert.executor import Report
from inspector.convert.kinds import Job, Request, get, of_output
from inspector.convert.options import ConvertOptions
from inspector.convert.verify import VerifyResult
from inspector.demo.writer import DemoSpec
from inspector.errors import CancelledError, OutputError
from inspector.remote.cloud_upload import META_CRC, META_JOB, CloudDestination
from inspector.remote.destination import destination_for
from inspector.scan.scanner import scan
from tests.remote.proxy import S3Proxy
from tests.remote.servers import azurite_connection

pytestmark = pytest.mark.remote

OUT = "ziout"  # the bucket / container the outputs go to (object_store quotes a `-` in a GCS bucket; moto does not unquote it)
SMALL = DemoSpec(stage=2, world_size=2, dtype="bf16", params=60_000)
BIG = DemoSpec(stage=2, world_size=2, dtype="bf16", params=4_000_000)  # fp32 shards of ~6 MB: 5 MiB parts


class Bucket:
    """The output bucket as the test sees it, through the store's own client (not obstore)."""

    def __init__(self, scheme: str, proxy: S3Proxy, client: Any) -> None:
        self.scheme, self.proxy, self.client = scheme, proxy, client

    def url(self, what: str) -> str:
        return f"{self.scheme}://{OUT}/out/{what}-{uuid.uuid4().hex[:8]}"

    @staticmethod
    def prefix(url: str) -> str:
        return url.split("/", 3)[3] + "/"

    def objects(self, url: str) -> dict[str, bytes]:
        p = self.prefix(url)
        if self.scheme == "az":
            return {
                b.name[len(p) :]: self.client.download_blob(b.name).readall()
                for b in self.client.list_blobs(p)
            }
        found = {}
        for page in self.client.get_paginator("list_objects_v2").paginate(Bucket=OUT, Prefix=p):
            for obj in page.get("Contents", []):
                found[obj["Key"][len(p) :]] = self.client.get_object(Bucket=OUT, Key=obj["Key"])[
                    "Body"
                ].read()
        return found

    def put(self, key: str, data: bytes, meta: dict[str, str] | None = None) -> None:
        if self.scheme == "az":
            self.client.upload_blob(key, data, overwrite=True, metadata=meta)
        else:
            self.client.put_object(Bucket=OUT, Key=key, Body=data, Metadata=meta or {})

    def open_uploads(self, url: str) -> list[str]:
        """Multipart uploads left open (moto); Azure's uncommitted blocks are never visible as objects."""
        if self.scheme == "az":
            return []
        page = self.client.list_multipart_uploads(Bucket=OUT, Prefix=self.prefix(url))
        return [u["Key"] for u in page.get("Uploads", [])]


@pytest.fixture
def gs_bucket(gs_server: tuple[S3Proxy, Any], monkeypatch: pytest.MonkeyPatch) -> Iterator[Bucket]:
    proxy, client = gs_server
    with suppress(client.exceptions.BucketAlreadyOwnedByYou):
        client.create_bucket(Bucket=OUT)
    monkeypatch.delenv("GOOGLE_SKIP_SIGNATURE", raising=False)  # a write is signed: a token moto ignores
    monkeypatch.setenv("GOOGLE_BEARER_TOKEN", "zi-test")
    yield Bucket("gs", proxy, client)
    proxy.throttle.reset()


@pytest.fixture
def az_bucket(azurite: tuple[S3Proxy, int]) -> Iterator[Bucket]:
    from azure.core.exceptions import ResourceExistsError
    from azure.storage.blob import BlobServiceClient

    proxy, port = azurite
    service = BlobServiceClient.from_connection_string(azurite_connection(f"http://127.0.0.1:{port}"))
    with suppress(ResourceExistsError):
        service.create_container(OUT)
    yield Bucket("az", proxy, service.get_container_client(OUT))
    proxy.throttle.reset()


@pytest.fixture(params=["gs", "az"])
def bucket(request: pytest.FixtureRequest) -> Bucket:
    got: Bucket = request.getfixturevalue(f"{request.param}_bucket")
    return got


def _run(job: Job, **kwargs: Any) -> Report:
    reports = [ev for ev in job.run(**kwargs) if isinstance(ev, Report)]
    assert len(reports) == 1
    return reports[0]


def _local(job_kind: str, ckpt: Any, out: Path, opts: ConvertOptions) -> dict[str, bytes]:
    _run(get(job_kind).plan(ckpt, Request(opts), str(out)))
    return {
        p.relative_to(out).as_posix(): p.read_bytes()
        for p in out.rglob("*")
        if p.is_file() and not p.name.startswith(".")
    }


@pytest.mark.parametrize("kind", ["weights", "universal"])
def test_a_conversion_uploads_the_bytes_a_local_one_writes(
    kind: str, bucket: Bucket, demo: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Large shards go up by multipart (5 MiB parts), small files in one request; `verify` reads them back."""
    monkeypatch.setenv("ZI_S3_PART_MIB", "5")
    ckpt = scan(str(demo(BIG if kind == "weights" else SMALL)))
    opts = ConvertOptions(dtype="float32", shard_size=7_000_000) if kind == "weights" else ConvertOptions()
    want = _local(kind, ckpt, tmp_path / "local", opts)
    url = bucket.url(kind)
    assert isinstance(destination_for(url, "j", False), CloudDestination)
    job = plan_output(get(kind), ckpt, Request(opts), url, str(tmp_path / "staging"))
    job.check_output(overwrite=False)
    seen: list[tuple[str, str]] = []
    bucket.proxy.throttle.fault = lambda method, path: seen.append((method, path))
    report = _run(job)
    bucket.proxy.throttle.reset()
    assert report.out_dir.startswith(url)
    assert bucket.objects(url) == want  # byte for byte, nothing more, nothing less
    assert bucket.open_uploads(url) == []
    if kind == "weights":  # parts: GCS's uploadId / Azure's blocks
        assert any(("uploadId=" in p or "comp=block" in p) for m, p in seen if m == "PUT"), seen
        assert max(len(v) for v in want.values()) > 5 << 20
    result = [ev for ev in of_output(url).verify(ckpt, url) if isinstance(ev, VerifyResult)][-1]
    assert result.ok and result.checked > 0


def test_a_cancel_mid_upload_leaves_nothing_visible(
    bucket: Bucket, demo: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Cancel while the second shard's parts go up: its upload is aborted, the first shard removed again."""
    monkeypatch.setenv("ZI_S3_PART_MIB", "5")
    url = bucket.url("cancel")
    cancel = threading.Event()
    files: list[str] = []

    def second(method: str, path: str) -> None:
        if method == "PUT" and ("uploadId=" in path or "comp=block" in path):
            name = path.split("?")[0]
            files.append(name) if name not in files else None
            if len(files) == 2:
                cancel.set()

    bucket.proxy.throttle.fault = second
    ckpt = scan(str(demo(BIG)))
    opts = ConvertOptions(dtype="float32", shard_size=6_000_000)
    job = plan_output(get("weights"), ckpt, Request(opts), url, str(tmp_path / "staging"))
    with pytest.raises(CancelledError):
        _run(job, cancel=cancel)
    bucket.proxy.throttle.reset()
    assert len(files) == 2
    assert bucket.objects(url) == {}
    assert bucket.open_uploads(url) == []


def test_another_object_is_kept_unless_overwrite(bucket: Bucket, demo: Any, tmp_path: Path) -> None:
    url = bucket.url("exists")
    key = bucket.prefix(url) + "model.safetensors"
    bucket.put(key, b"the user's own file")
    ckpt = scan(str(demo(SMALL)))
    job = plan_output(get("weights"), ckpt, Request(), url, str(tmp_path / "staging"))
    with pytest.raises(OutputError, match=r"already holds model\.safetensors"):
        _run(job)
    assert bucket.objects(url)["model.safetensors"] == b"the user's own file"
    _run(job, overwrite=True)
    assert bucket.objects(url)["model.safetensors"][8:9] == b"{"  # a safetensors header


@pytest.mark.parametrize("multipart", [False, True])
def test_an_object_appearing_during_the_run_is_not_overwritten(
    multipart: bool, az_bucket: Bucket, demo: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The check found the key free; someone writes it before our upload: a single put is refused by the
    store (If-None-Match), a multipart one by the lookup just before it."""
    bucket = az_bucket
    monkeypatch.setenv("ZI_S3_PART_MIB", "5")
    url = bucket.url("race")
    ckpt = scan(str(demo(BIG if multipart else SMALL)))
    opts = ConvertOptions(dtype="float32") if multipart else ConvertOptions()
    job = plan_output(get("weights"), ckpt, Request(opts), url, str(tmp_path / "staging"))
    key = bucket.prefix(url) + "model.safetensors"
    real = CloudDestination.publish

    def plant(self: CloudDestination, fd: int, size: int, crc: int, rel: str) -> None:
        if rel == "model.safetensors":
            bucket.put(key, b"theirs")
        real(self, fd, size, crc, rel)

    monkeypatch.setattr(CloudDestination, "publish", plant)
    with pytest.raises(OutputError, match="appeared while this run was writing it"):
        _run(job)
    assert bucket.objects(url) == {"model.safetensors": b"theirs"}


def test_a_rerun_reuses_only_what_it_proves(az_bucket: Bucket, demo: Any, tmp_path: Path) -> None:
    """Kill before the last shard and the index (they are lost): the rerun writes those two only. An object
    whose metadata copies this job's identity with a CRC-32 its bytes do not have is rewritten."""
    bucket = az_bucket
    url = bucket.url("resume")
    ckpt = scan(str(demo(SMALL)))
    opts = ConvertOptions(shard_size=50_000)
    job = plan_output(get("weights"), ckpt, Request(opts), url, str(tmp_path / "staging"))
    _run(job)
    first = bucket.objects(url)
    shards = sorted(n for n in first if n.endswith(".safetensors"))
    assert len(shards) >= 3
    p = bucket.prefix(url)
    for name in (shards[-1], "model.safetensors.index.json"):
        bucket.client.delete_blob(p + name)
    props = bucket.client.get_blob_client(p + shards[0]).get_blob_properties()
    forged = dict(props.metadata)
    assert forged[META_JOB] == job.identity and forged[META_CRC].isdigit()
    bucket.put(p + shards[1], b"x" * len(first[shards[1]]), forged)  # this job's metadata, not its bytes
    seen: list[tuple[str, str]] = []
    bucket.proxy.throttle.fault = lambda method, path: seen.append((method, path))
    report = _run(plan_output(get("weights"), ckpt, Request(opts), url, str(tmp_path / "staging")))
    bucket.proxy.throttle.reset()
    written = sorted({path.split("?")[0].rsplit("/", 1)[-1] for m, path in seen if m == "PUT"})
    assert written == sorted([shards[1], shards[-1], "model.safetensors.index.json"])
    assert report.resumed_shards == len(shards) - 2
    assert bucket.objects(url) == first


def test_parts_then_the_finishing_run_equal_one_local_run(az_bucket: Bucket, demo: Any, tmp_path: Path) -> None:
    """`--part I/N` into az://: each part publishes its share; the finishing run reuses them (proven by
    reading them back) and writes the rest, the index last; the prefix then holds one local run's bytes."""
    bucket = az_bucket
    ckpt = scan(str(demo(SMALL)))
    opts = ConvertOptions(shard_size=50_000)
    want = _local("weights", ckpt, tmp_path / "local", opts)
    url = bucket.url("parts")
    for i in (0, 1):
        job = plan_output(get("weights"), ckpt, Request(opts), url, str(tmp_path / "staging"), part=(i, 2))
        _run(job, part=(i, 2))
    staged = bucket.objects(url)
    assert staged and set(staged) < set(want) and "model.safetensors.index.json" not in staged
    assert all(staged[name] == want[name] for name in staged)
    report = _run(plan_output(get("weights"), ckpt, Request(opts), url, str(tmp_path / "staging")))
    assert report.resumed_shards == len(staged)
    assert bucket.objects(url) == want
