"""Snapshot tests (pytest-textual-snapshot): fixed size, fixed path, frozen preflight figures and meters.

`pytest tests/tui --snapshot-update` rewrites them after an intended change; look at the report first.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from textual.pilot import Pilot
from textual.widgets import Input

from inspector.convert.options import ConvertOptions
from inspector.tui.app import InspectorApp, make_app
from inspector.tui.frozen import fake_progress, frozen_assess
from inspector.tui.messages import ChildEvent
from inspector.tui.screens.convert import ConvertScreen
from tests.tui.conftest import wait_for

OUT = "/tmp/zero-inspector-snapshot-out"

# No reruns: the auto-height widgets that were now and then laid out a row or two short on a loaded machine
# were a Textual box-model cache race (inspector/tui/widgets/auto_height.py, tests/tui/test_layout_race.py).


def _app(root: Path, **kw: object) -> InspectorApp:
    app = make_app(path=str(root), out_dir=OUT, live_meters=False, **kw)
    app.frozen_assess = frozen_assess()
    return app


async def _scanned(pilot: Pilot[object]) -> None:
    await wait_for(pilot, lambda: pilot.app.ckpt is not None, "the scan")  # type: ignore[attr-defined]
    await pilot.app.workers.wait_for_complete()
    await pilot.pause()
    await pilot.wait_for_scheduled_animations()
    await pilot.pause()  # a busy machine can leave the last refresh for the next frame
    await _settled(pilot)


async def _settled(pilot: Pilot[object]) -> None:
    """Wait until two renders 50 ms apart agree: on a loaded machine the last refresh can land a frame or two
    after the pilot's pause. Input cursors stop blinking first (shown steadily): a wait longer than the 0.5 s
    blink would otherwise catch a focused field's cursor in either phase."""
    for screen in pilot.app.screen_stack:
        for field in screen.query(Input):
            field.cursor_blink = False
    last = None
    for _ in range(40):
        await pilot.pause(0.05)
        shot = pilot.app.export_screenshot()
        if shot == last:
            return
        last = shot
    raise AssertionError("the screen did not settle within 2 s")


@pytest.mark.parametrize("size", [(80, 24), (120, 36)])
def test_overview(snap_compare, snapshot_demo: Path, size: tuple[int, int]) -> None:  # type: ignore[no-untyped-def]
    assert snap_compare(_app(snapshot_demo), terminal_size=size, run_before=_scanned)


@pytest.mark.parametrize("size", [(80, 24), (120, 36)])
def test_tensors(snap_compare, snapshot_demo: Path, size: tuple[int, int]) -> None:  # type: ignore[no-untyped-def]
    async def run(pilot: Pilot[object]) -> None:
        await _scanned(pilot)
        await pilot.press("t", "down", "down", "right", "down", "down", "down", "space", "down")
        await _settled(pilot)

    assert snap_compare(_app(snapshot_demo), terminal_size=size, run_before=run)


@pytest.mark.parametrize("size", [(80, 24), (120, 36)])
def test_health(snap_compare, snapshot_demo: Path, size: tuple[int, int]) -> None:  # type: ignore[no-untyped-def]
    """The Health tab after a finished pass, the second row highlighted (its numbers under the table)."""

    async def run(pilot: Pilot[object]) -> None:
        await _scanned(pilot)
        await pilot.press("h")
        pane = pilot.app.main.health_pane  # type: ignore[attr-defined]
        await wait_for(pilot, lambda: pane.report is not None and not pane.running, "the health pass")
        await pilot.press("down")
        await _settled(pilot)

    assert snap_compare(_app(snapshot_demo), terminal_size=size, run_before=run)


@pytest.mark.parametrize("size", [(80, 24), (120, 36)])
def test_export(snap_compare, snapshot_demo: Path, size: tuple[int, int]) -> None:  # type: ignore[no-untyped-def]
    async def run(pilot: Pilot[object]) -> None:
        await _scanned(pilot)
        await pilot.press("e")
        await wait_for(
            pilot, lambda: pilot.app.screen.query_one("#preflight").assessment is not None, "preflight"
        )
        await _settled(pilot)

    app = _app(snapshot_demo, options=ConvertOptions(include=("model.layers.0",), dtype="bf16"))
    assert snap_compare(app, terminal_size=size, run_before=run)


def test_export_does_not_fit(snap_compare, snapshot_demo: Path) -> None:  # type: ignore[no-untyped-def]
    async def run(pilot: Pilot[object]) -> None:
        await _scanned(pilot)
        await pilot.press("e")
        await wait_for(
            pilot, lambda: pilot.app.screen.query_one("#preflight").assessment is not None, "preflight"
        )
        await _settled(pilot)

    app = _app(snapshot_demo)
    app.frozen_assess = frozen_assess(available=200 * 2**20, free_disk=10 * 2**20)
    assert snap_compare(app, terminal_size=(120, 36), run_before=run)


@pytest.mark.parametrize("size", [(80, 24), (120, 36)])
def test_convert_in_progress(snap_compare, snapshot_demo: Path, size: tuple[int, int]) -> None:  # type: ignore[no-untyped-def]
    """The convert screen fed a fixed event stream and fixed meter samples (no child runs)."""

    async def run(pilot: Pilot[object]) -> None:
        from inspector.convert.kinds.safetensors import SafetensorsJob
        from inspector.convert.plan import build_plan

        app = pilot.app
        await _scanned(pilot)
        screen = ConvertScreen(autostart=False)
        await app.push_screen(screen)  # type: ignore[attr-defined]
        plan = build_plan(app.ckpt, ConvertOptions(shard_size=2_000_000))  # type: ignore[attr-defined]
        job = SafetensorsJob("weights", OUT, plan)
        a = frozen_assess()(job)
        screen.show_started(job, a.predicted_peak_rss)
        peak = a.predicted_peak_rss  # a run that stays under its prediction, as measured runs do
        for i, part in enumerate([0.45, 0.7, 0.82, 0.86, 0.87, 0.9, 0.91, 0.9, 0.89, 0.9, 0.91, 0.9]):
            screen.query_one("#meter").add_sample(int(peak * part), 20 * 2**30 - i * 2**20)
        for ev in fake_progress(plan, 0.6):
            screen.post_message(ChildEvent("convert", ev))
        await _settled(pilot)

    assert snap_compare(_app(snapshot_demo), terminal_size=size, run_before=run)


def test_help(snap_compare, snapshot_demo: Path) -> None:  # type: ignore[no-untyped-def]
    async def run(pilot: Pilot[object]) -> None:
        from inspector.tui.screens.help import HelpScreen

        await _scanned(pilot)
        await pilot.press("question_mark")
        await wait_for(
            pilot, lambda: isinstance(pilot.app.screen, HelpScreen) and pilot.app.screen.is_mounted, "help"
        )
        await _settled(pilot)

    assert snap_compare(_app(snapshot_demo), terminal_size=(100, 36), run_before=run)
