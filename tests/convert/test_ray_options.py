"""`convert --executor ray` without a cluster: what is refused, and how (the cluster itself: tests/cluster)."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from inspector.demo.writer import DemoSpec
from inspector.errors import InspectorError
from tests.conftest import CliResult, DemoCache

SPEC = DemoSpec(params=2_000_000)


def test_without_ray_installed_the_error_says_how_to_get_it(monkeypatch: pytest.MonkeyPatch) -> None:
    from inspector.convert import ray_executor

    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` raises ImportError
    with pytest.raises(InspectorError) as err:
        ray_executor.connect(None)
    assert "zero-inspector[ray]" in err.value.hint


@pytest.mark.parametrize(
    "extra, words",
    [(["--part", "0/2"], "--part and --executor ray"), (["--parts", "0"], "at least 1")],
)
def test_ray_with_another_split_or_no_parts_is_refused(
    demo: DemoCache, tmp_path: Path, cli: Callable[..., CliResult], extra: list[str], words: str
) -> None:
    r = cli("convert", demo(SPEC), tmp_path / "out", "--executor", "ray", *extra)
    assert r.rc == 2 and words in r.stderr + r.stdout and "Traceback" not in r.stderr
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


def test_tasks_get_the_drivers_store_environment_only_for_a_bucket(monkeypatch: pytest.MonkeyPatch) -> None:
    """Ray starts workers from the node's environment: a bucket job hands them the driver's AWS_* and ZI_S3_*
    (through runtime_env, never printed); a local job hands nothing; ZI_RAY_AWS_ENV=node keeps the nodes'."""
    from inspector.convert.ray_executor import store_env

    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "s")
    monkeypatch.setenv("ZI_S3_INFLIGHT", "4")
    monkeypatch.setenv("HOME_NOT_FORWARDED", "x")
    env = store_env("s3://bucket/run")
    assert env["AWS_ENDPOINT_URL"] == "http://127.0.0.1:9" and env["ZI_S3_INFLIGHT"] == "4"
    assert env["AWS_SECRET_ACCESS_KEY"] == "s" and "HOME_NOT_FORWARDED" not in env
    assert store_env("/local/ckpt") == {}
    assert store_env("/local/ckpt", "s3://bucket/out") == env  # a bucket OUT: the tasks upload
    monkeypatch.setenv("ZI_RAY_AWS_ENV", "node")
    assert store_env("s3://bucket/run") == {}
