"""`convert s3://… OUT --executor ray` on the local two-node cluster, the checkpoint on moto's S3 server
(tests/remote's fixtures): every task opens its own store client from the URL with the driver's AWS_*
environment, handed through Ray's runtime_env (the nodes have none of their own), and the folder equals one
run from the same bucket."""

from __future__ import annotations

from pathlib import Path
from typing import Any

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
    assert "Ray: 2 part(s) on" in run.stdout, run.stdout
    assert SECRET not in run.output
    assert s3_proxy.throttle.requests > before
    assert _tree(tmp_path / "ray") == _tree(tmp_path / "one")
    checked = run_cli("verify", url, tmp_path / "ray")
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
