"""`convert --executor ray` on a local Ray cluster of two nodes (`ray.cluster_utils.Cluster`, one CPU each):
the parts run as tasks on both nodes and the output is byte for byte the output of one local run; a cancelled
run leaves a folder the next run finishes, identical again.

Never `ray stop` (it kills every Ray process of the machine by name): the cluster is shut down through the
object that started it.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from inspector.demo.writer import DemoSpec
from tests.conftest import DemoCache, run_cli

pytestmark = pytest.mark.cluster
SPEC = DemoSpec(stage=3, world_size=2, dtype="bf16", params=6_000_000)


def _files(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file()}


@pytest.mark.parametrize(
    "kind, extra",
    [("weights", ["--shard-size", "3MB", "--dtype", "bf16"]), ("universal", [])],
)
def test_ray_parts_on_two_nodes_equal_one_local_run(
    cluster: Any, demo: DemoCache, tmp_path: Path, kind: str, extra: list[str]
) -> None:
    root = str(demo(SPEC))
    local, remote = tmp_path / "local", tmp_path / "ray"
    assert run_cli("convert", root, str(local), "--format", kind, *extra).rc == 0
    run = run_cli(
        "convert",
        root,
        str(remote),
        "--format",
        kind,
        *extra,
        "--executor",
        "ray",
        "--ray-address",
        cluster.address,
    )
    assert run.rc == 0, run.stderr
    # where the parts run is Ray's choice (SPREAD asks for different nodes; tasks this small can finish on one
    # before the other's worker has started): the output must not depend on it
    assert "Ray: 2 parts on" in run.stdout, run.stdout
    if kind == "universal":  # the universal output is a tree of folders: compare every file under it
        a = {str(p.relative_to(local)): p.read_bytes() for p in local.rglob("*") if p.is_file()}
        b = {str(p.relative_to(remote)): p.read_bytes() for p in remote.rglob("*") if p.is_file()}
        assert a.keys() == b.keys() and a == b
    else:
        assert _files(local) == _files(remote)
    verify = run_cli("verify", root, str(remote))
    assert verify.rc == 0, verify.stdout + verify.stderr


@pytest.fixture
def driver(cluster: Any) -> Iterator[str]:
    """The cluster's address, for a test that drives `run_on_ray` in this process; disconnected after it."""
    import ray

    try:
        yield cluster.address
    finally:
        if ray.is_initialized():
            ray.shutdown()


def test_a_cancelled_run_is_finished_by_the_next(driver: str, demo: DemoCache, tmp_path: Path) -> None:
    """Cancelled right after the tasks are submitted (in-process driver): CancelledError, no published
    output; the same command again completes, byte for byte the local result."""
    import threading

    from inspector.convert.kinds.base import Request
    from inspector.convert.options import ConvertOptions
    from inspector.convert.order import Order
    from inspector.convert.ray_executor import run_on_ray
    from inspector.errors import CancelledError

    root = str(demo(SPEC))
    local, remote = tmp_path / "local", tmp_path / "ray"
    assert run_cli("convert", root, str(local), "--format", "weights", "--shard-size", "3MB").rc == 0
    spec = Order(root, str(remote), "weights", request=Request(ConvertOptions(shard_size=3_000_000)))
    stop = threading.Event()
    stop.set()
    with pytest.raises(CancelledError):
        for _ in run_on_ray(spec, address=driver, cancel=stop):
            pass
    assert not (remote / "model.safetensors.index.json").exists()
    events = list(run_on_ray(spec, address=driver))
    report = events[-1]
    assert report.files and _files(local) == _files(remote)


def test_a_task_that_fails_reports_its_own_error(driver: str, demo: DemoCache, tmp_path: Path) -> None:
    """OUT below a regular file: the driver plans fine, every task fails to create OUT; the driver raises the
    task's own error (the output root's words), not a Ray traceback."""
    from inspector.convert.order import Order
    from inspector.convert.ray_executor import run_on_ray
    from inspector.errors import InspectorError

    (tmp_path / "file").write_bytes(b"x")
    spec = Order(str(demo(SPEC)), str(tmp_path / "file" / "out"), "weights")
    with pytest.raises(InspectorError) as err:
        for _ in run_on_ray(spec, address=driver):
            pass
    assert "Ray" not in type(err.value).__name__ and "out" in str(err.value)


def test_the_json_lines_face_reports_ray_runs_like_local_ones(
    cluster: Any, demo: DemoCache, tmp_path: Path
) -> None:
    """What the app reads from its child: started, progress, finished, with the same fields as a local run."""
    import json

    from inspector.convert.events import Finished, Progressed, Started, from_doc

    out = tmp_path / "out"
    run = run_cli(
        "convert",
        demo(SPEC),
        out,
        "--format",
        "weights",
        "--progress",
        "json",
        "--executor",
        "ray",
        "--ray-address",
        cluster.address,
    )
    assert run.rc == 0, run.stderr
    events = [from_doc(json.loads(line)) for line in run.stdout.splitlines() if line.strip()]
    assert isinstance(events[0], Started) and isinstance(events[-1], Finished)
    assert any(isinstance(e, Progressed) for e in events)
    assert events[-1].bytes_written == sum(f.stat().st_size for f in out.iterdir())


@pytest.mark.asyncio
async def test_the_app_converts_on_the_cluster(cluster: Any, demo: DemoCache, tmp_path: Path) -> None:
    """Export form set to "Run on: a Ray cluster" (the app's settings, as the form stores them): `c` runs the
    child with --executor ray; its progress reaches the convert screen and the output equals a local run."""
    from dataclasses import replace

    from inspector.tui.app import make_app
    from tests.tui.conftest import converted, scanned

    root = demo(SPEC)
    local, out = tmp_path / "local", tmp_path / "app"
    assert run_cli("convert", root, local, "--format", "weights").rc == 0
    app = make_app(path=str(root), out_dir=str(out), live_meters=False)
    async with app.run_test(size=(120, 36)) as pilot:
        await scanned(pilot)
        app.export = replace(app.export, format="weights", executor="ray", ray_address=cluster.address)
        assert await converted(pilot) == "done"
    assert _files(local) == _files(out)
