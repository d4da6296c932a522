"""`convert s3://… OUT --executor ray` on the local two-node cluster, the checkpoint on moto's S3 server
(tests/remote's fixtures): every task opens its own store client from the URL with the driver's AWS_*
environment, handed through Ray's runtime_env (the nodes have none of their own), and the folder equals one
run from the same bucket. Into a bucket OUT too: the tasks stage on their nodes and upload their shares, the
driver finishes from the bucket's listing and uploads the index (or latest_universal) last."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import pytest

pytest.importorskip("boto3")
pytest.importorskip("moto.server")

from tests.conftest import run_cli
from tests.remote import conftest as remote
from tests.remote.proxy import S3Proxy

# tests/remote's fixtures (moto behind the proxy, the demo uploaded), shared rather than copied
s3_proxy, s3_client, s3_demo = remote.s3_proxy, remote.s3_client, remote.s3_demo
SECRET = remote.SECRET

pytestmark = pytest.mark.cluster


def _tree(folder: Path) -> dict[str, bytes]:
    return {
        p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()
    }


@pytest.mark.parametrize(
    "kind, extra", [("weights", ["--shard-size", "1MB"]), ("universal", [])], ids=["weights", "universal"]
)
def test_ray_tasks_read_the_bucket_and_equal_one_run(
    cluster: Any, s3_demo: tuple[str, Path], s3_proxy: S3Proxy, tmp_path: Path, kind: str, extra: list[str]
) -> None:
    url, _ = s3_demo
    args = ["--format", kind, *extra]
    one = run_cli("convert", url, tmp_path / "one", *args)
    assert one.rc == 0, one.output
    before = s3_proxy.throttle.requests
    run = run_cli(
        "convert", url, tmp_path / "ray", *args, "--executor", "ray", "--ray-address", cluster.address
    )
    assert run.rc == 0, run.output
    assert "Ray: 2 parts on" in run.stdout, run.stdout
    assert SECRET not in run.output
    assert s3_proxy.throttle.requests > before
    assert _tree(tmp_path / "ray") == _tree(tmp_path / "one")
    checked = run_cli("verify", url, tmp_path / "ray")
    assert checked.rc == 0, checked.output


@pytest.mark.parametrize(
    "kind, extra, last",
    [
        ("weights", ["--shard-size", "1MB"], "model.safetensors.index.json"),
        ("universal", [], "latest_universal"),
    ],
    ids=["weights", "universal"],
)
def test_ray_tasks_upload_into_a_bucket_and_equal_one_local_run(
    cluster: Any,
    s3_demo: tuple[str, Path],
    s3_client: Any,
    s3_proxy: S3Proxy,
    tmp_path: Path,
    kind: str,
    extra: list[str],
    last: str,
) -> None:
    from tests.remote.test_upload import objects, open_uploads

    url, _ = s3_demo
    args = ["--format", kind, *extra]
    one = run_cli("convert", url, tmp_path / "one", *args)
    assert one.rc == 0, one.output
    out = f"s3://{remote.BUCKET}/ray-out/{kind}-{uuid.uuid4().hex[:8]}"
    prefix = "/" + out.removeprefix("s3://") + "/"
    puts: list[str] = []

    def record(method: str, path: str) -> None:
        name = unquote(path.split("?")[0])
        if method == "PUT" and name.startswith(prefix) and (not puts or puts[-1] != name[len(prefix) :]):
            puts.append(name[len(prefix) :])

    s3_proxy.throttle.fault = record
    try:
        run = run_cli("convert", url, out, *args, "--executor", "ray", "--ray-address", cluster.address)
    finally:
        s3_proxy.throttle.fault = None
    assert run.rc == 0, run.output
    assert "Ray: 2 parts on" in run.stdout and "Uploaded to " + out in run.stdout, run.stdout
    assert SECRET not in run.output
    want = _tree(tmp_path / "one")
    assert objects(s3_client, out) == want  # byte for byte one local run's
    assert sorted(puts) == sorted(want) and puts[-1] == last  # each file once; the driver's index last
    assert open_uploads(s3_client, out) == []
    checked = run_cli("verify", url, out)
    assert checked.rc == 0, checked.output


def test_with_the_nodes_own_environment_the_task_says_what_is_missing(
    cluster: Any, s3_demo: tuple[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ZI_RAY_AWS_ENV=node: the tasks get only the nodes' environment, which here has no credentials; the
    driver shows the task's own one-line error (exit 2), never a traceback or the driver's secret."""
    monkeypatch.setenv("ZI_RAY_AWS_ENV", "node")
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")
    run = run_cli(
        "convert", s3_demo[0], tmp_path / "out", "--executor", "ray", "--ray-address", cluster.address
    )
    assert run.rc == 2, run.output
    assert "No credentials" in run.output
    assert SECRET not in run.output and "Traceback" not in run.output


def test_a_cancelled_ray_run_into_a_bucket_leaves_no_index_and_the_next_finishes(
    cluster: Any, s3_demo: tuple[str, Path], s3_client: Any, s3_proxy: S3Proxy, tmp_path: Path
) -> None:
    """Cancelled once the tasks have written bytes (in-process driver): CancelledError, no index and no
    open upload (each interrupted task aborted its upload and removed its objects); the same job again
    completes the prefix, byte for byte one local run's."""
    import os
    import tempfile
    import threading
    import time

    import ray

    from inspector.convert.bucket import staging_for
    from inspector.convert.executor import Progress
    from inspector.convert.kinds.base import Request
    from inspector.convert.options import ConvertOptions
    from inspector.convert.order import Order
    from inspector.convert.ray_executor import run_on_ray
    from inspector.convert.root import LOCK
    from inspector.errors import CancelledError
    from tests.remote.test_upload import objects, open_uploads

    url, _ = s3_demo
    assert run_cli("convert", url, tmp_path / "one", "--format", "weights", "--shard-size", "500KB").rc == 0
    out = f"s3://{remote.BUCKET}/ray-out/cancel-{uuid.uuid4().hex[:8]}"
    spec = Order(url, out, "weights", request=Request(ConvertOptions(shard_size=500_000)))
    stop = threading.Event()
    s3_proxy.throttle.latency_s = 0.05  # slow enough that the tasks are uploading when the cancel comes
    try:
        with pytest.raises(CancelledError):
            for ev in run_on_ray(spec, address=cluster.address, cancel=stop):
                if isinstance(ev, Progress) and ev.bytes_done > 0:
                    stop.set()
        s3_proxy.throttle.latency_s = 0.0
        locks = [
            os.path.join(tempfile.gettempdir(), f"{LOCK}.{os.path.basename(staging_for(out, None, (i, 2)))}")
            for i in range(2)
        ]
        deadline = time.monotonic() + 60
        while any(os.path.exists(p) for p in locks):  # the interrupted tasks clean up, then unlock
            assert time.monotonic() < deadline, "a cancelled task never released its staging folder"
            time.sleep(0.2)
        assert "model.safetensors.index.json" not in objects(s3_client, out)
        assert open_uploads(s3_client, out) == []
        events = list(run_on_ray(spec, address=cluster.address))
    finally:
        s3_proxy.throttle.latency_s = 0.0
        if ray.is_initialized():
            ray.shutdown()
    assert events[-1].files
    assert objects(s3_client, out) == _tree(tmp_path / "one")
