"""Launching: the CLI routes PATH/--demo to the app, `--progress json` speaks JSON lines, no torch at start."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from inspector.cli.main import _route, build_parser
from inspector.tui.app import make_app
from tests.tui.conftest import wait_for


def test_path_and_demo_route_to_open(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "ckpt").mkdir()
    monkeypatch.chdir(tmp_path)  # an existing PATH opens the app; a missing one is answered on the terminal
    assert _route(["ckpt/"]) == ["open", "ckpt/"]
    assert _route(["--demo"]) == ["open", "--demo"]
    assert _route(["--demo", "--dtype", "bf16"]) == ["open", "--demo", "--dtype", "bf16"]
    assert _route(["scan", "ckpt/"]) == ["scan", "ckpt/"]
    assert _route(["--help"]) == ["--help"]
    args = build_parser().parse_args(
        _route(["ckpt/", "--include", "model.layers.1", "--dtype", "bf16", "--out", "o"])
    )
    assert args.command == "open" and args.include == ["model.layers.1"] and args.dtype == "bf16"


def test_open_without_path_is_a_usage_error(cli) -> None:  # type: ignore[no-untyped-def]
    r = cli("open")
    assert r.rc == 2 and "Nothing to open" in r.stderr


def test_convert_progress_json(cli, small_demo: Path, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    r = cli("convert", small_demo, tmp_path / "out", "--shard-size", "1MB", "--progress", "json")
    assert r.rc == 0, r.output
    events = [json.loads(line) for line in r.stdout.splitlines()]
    kinds = [e["event"] for e in events]
    assert kinds[0] == "start" and kinds[-1] == "report" and "progress" in kinds
    last = [e for e in events if e["event"] == "progress"][-1]
    assert last["bytes_done"] == last["bytes_total"] and last["file_done"] == last["file_total"]
    assert events[-1]["files"] and events[-1]["peak_rss"] > 0
    v = cli("verify", small_demo, tmp_path / "out", "--progress", "json")
    assert v.rc == 0 and json.loads(v.stdout.splitlines()[-1])["ok"] is True


def test_convert_progress_json_error_line(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    r = cli("convert", tmp_path, tmp_path / "out", "--progress", "json")
    error = json.loads(r.stdout.splitlines()[-1])
    assert error["event"] == "error" and error["exit_code"] == r.rc != 0 and error["title"]


def test_no_torch_at_startup(small_demo: Path) -> None:
    """The app is built and a scan runs without importing torch (a subprocess starts clean)."""
    import subprocess
    import sys

    code = (
        "import sys, asyncio\n"
        "from inspector.tui.app import make_app\n"
        f"app = make_app(path={str(small_demo)!r}, live_meters=False)\n"
        "async def main():\n"
        "    async with app.run_test() as pilot:\n"
        "        while app.ckpt is None: await pilot.pause(0.05)\n"
        "asyncio.run(main())\n"
        "print('torch' in sys.modules, app.ckpt is not None)\n"
    )
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=root, timeout=120
    ).stdout
    assert out.split()[-2:] == ["False", "True"]


def test_the_child_gets_the_apps_own_order() -> None:
    """The child plans from the order the app previewed (JSON on its stdin), not from a flattened argv: every
    option arrives, `--source module` and the executor included."""
    from inspector.convert.kinds import Request
    from inspector.convert.options import ConvertOptions
    from inspector.convert.order import Order, from_json, to_json
    from inspector.tui.jobs import child_args

    o = ConvertOptions(
        dtype="bf16",
        shard_size=123_456_789,
        include=("model.layers.1", "-odd*"),
        renames=((r"^model\.", "m."), ("x", "y=z")),
        keep_fp32=("*norm*",),
        exclude_frozen=True,
        source="module",
    )
    order = Order("/ckpt", "/out", "universal", "global_step3", Request(o), overwrite=True, executor="ray",
                  ray_address="head:6379")
    args = build_parser().parse_args(child_args(order))
    assert (args.path, args.out, args.order, args.progress) == ("/ckpt", "/out", "-", "json")
    assert from_json(to_json(order)) == order


@pytest.mark.asyncio
async def test_demo_is_written_in_a_child_and_opened() -> None:
    """`--demo`: the writer runs in a child (tui/commands.write_demo_checkpoint); the app opens the result."""

    app = make_app(demo=True, demo_params="200K", live_meters=False)
    try:
        async with app.run_test(size=(100, 30)) as pilot:
            await wait_for(pilot, lambda: app.ckpt is not None, "the demo")
            assert app.ckpt is not None
            opened = app.ckpt.root  # the checkpoint the app shows
            assert os.path.isdir(opened) and os.path.basename(opened) == "demo-checkpoint"
    finally:
        app.cleanup()
    assert not os.path.exists(opened) and not os.path.exists(os.path.dirname(opened))  # gone with the app
