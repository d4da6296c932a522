"""Snapshot tests (pytest-textual-snapshot): fixed size, fixed path, frozen preflight figures and meters.

Every fixed screen at 80x24 and 120x36: overview, tensors, health, a tensor's statistics, help, export
(fits and does not fit), convert in progress, done and verified, the quit question and an error dialog. No
child process runs: the convert screen is fed the events a child would print. `test_resize_*` checks that
the layout follows the terminal both ways (a snapshot is taken at one size and cannot see that).

`pytest tests/tui --snapshot-update` rewrites them after an intended change; look at the report first.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from textual.pilot import Pilot
from textual.widgets import Input

from inspector.convert.events import Finished, Verified
from inspector.convert.kinds import Job
from inspector.convert.options import ConvertOptions
from inspector.tui.app import InspectorApp, make_app
from inspector.tui.child import Child
from inspector.tui.frozen import fake_progress, frozen_assess
from inspector.tui.messages import ChildEvent, ChildExited
from inspector.tui.screens.convert import ConvertScreen, Phase
from inspector.tui.screens.dialogs import ConfirmDialog, MessageDialog
from inspector.tui.widgets.keybar import KeyBar
from inspector.tui.widgets.tensor_detail import TensorDetail
from tests.tui.conftest import plain, wait_for

OUT = "/tmp/zero-inspector-snapshot-out"
SIZES = pytest.mark.parametrize("size", [(80, 24), (120, 36)])

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


@SIZES
def test_overview(snap_compare, snapshot_demo: Path, size: tuple[int, int]) -> None:  # type: ignore[no-untyped-def]
    assert snap_compare(_app(snapshot_demo), terminal_size=size, run_before=_scanned)


@SIZES
def test_tensors(snap_compare, snapshot_demo: Path, size: tuple[int, int]) -> None:  # type: ignore[no-untyped-def]
    async def run(pilot: Pilot[object]) -> None:
        await _scanned(pilot)
        await pilot.press("t", "down", "down", "right", "down", "down", "down", "space", "down")
        await _settled(pilot)

    assert snap_compare(_app(snapshot_demo), terminal_size=size, run_before=run)


@SIZES
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


async def _export_open(pilot: Pilot[object]) -> None:
    """The export form open on the scanned checkpoint, its preflight answered."""
    await _scanned(pilot)
    await pilot.press("e")
    await wait_for(pilot, lambda: pilot.app.screen.query_one("#preflight").assessment is not None, "preflight")
    await _settled(pilot)


@SIZES
def test_export(snap_compare, snapshot_demo: Path, size: tuple[int, int]) -> None:  # type: ignore[no-untyped-def]
    app = _app(snapshot_demo, options=ConvertOptions(include=("model.layers.0",), dtype="bf16"))
    assert snap_compare(app, terminal_size=size, run_before=_export_open)


@SIZES
def test_export_does_not_fit(snap_compare, snapshot_demo: Path, size: tuple[int, int]) -> None:  # type: ignore[no-untyped-def]
    app = _app(snapshot_demo)
    app.frozen_assess = frozen_assess(available=200 * 2**20, free_disk=10 * 2**20)
    assert snap_compare(app, terminal_size=size, run_before=_export_open)


@SIZES
def test_convert_in_progress(snap_compare, snapshot_demo: Path, size: tuple[int, int]) -> None:  # type: ignore[no-untyped-def]
    """The convert screen fed a fixed event stream and fixed meter samples (no child runs)."""

    async def run(pilot: Pilot[object]) -> None:
        await _converting(pilot, 0.6)
        await _settled(pilot)

    assert snap_compare(_app(snapshot_demo), terminal_size=size, run_before=run)


async def _converting(pilot: Pilot[object], fraction: float) -> tuple[ConvertScreen, Job]:
    """The convert screen of a 4-file job at `fraction`, as its child's events would draw it, with meter
    samples that stay under the prediction (as measured runs do)."""
    from inspector.convert.kinds.safetensors import SafetensorsJob
    from inspector.convert.plan import build_plan

    app = pilot.app
    assert isinstance(app, InspectorApp)
    await _scanned(pilot)
    assert app.ckpt is not None
    screen = ConvertScreen(autostart=False)
    await app.push_screen(screen)
    plan = build_plan(app.ckpt, ConvertOptions(shard_size=2_000_000))
    job = SafetensorsJob("weights", OUT, plan)
    peak = frozen_assess()(job).predicted_peak_rss
    screen.show_started(job, peak)
    for i, part in enumerate([0.45, 0.7, 0.82, 0.86, 0.87, 0.9, 0.91, 0.9, 0.89, 0.9, 0.91, 0.9]):
        screen.query_one("#meter").add_sample(int(peak * part), 20 * 2**30 - i * 2**20)
    for ev in fake_progress(plan, fraction):
        screen.post_message(ChildEvent("convert", ev))
    await pilot.pause()
    return screen, job


async def _finished(pilot: Pilot[object]) -> ConvertScreen:
    """A conversion whose child reported every file written and exited 0."""
    screen, job = await _converting(pilot, 1.0)
    files = [[f.name, f.nbytes] for f in job.files]
    report = Finished(
        OUT,
        files,
        job.tensor_count,
        job.output_bytes,
        1.8,
        peak_rss=int(0.91 * screen.query_one("#meter").predicted),
    )
    screen.post_message(ChildEvent("convert", report))
    screen.post_message(ChildExited("convert", 0, ""))
    await wait_for(pilot, lambda: screen.phase is Phase.DONE, "done")
    # the "Conversion finished" toast goes after 5 s: on a loaded machine the picture could be taken either side
    pilot.app.clear_notifications()
    return screen


@SIZES
def test_convert_done(snap_compare, snapshot_demo: Path, size: tuple[int, int]) -> None:  # type: ignore[no-untyped-def]
    async def run(pilot: Pilot[object]) -> None:
        await _finished(pilot)
        await _settled(pilot)

    assert snap_compare(_app(snapshot_demo), terminal_size=size, run_before=run)


@SIZES
def test_verified(
    snap_compare, snapshot_demo: Path, size: tuple[int, int], monkeypatch: pytest.MonkeyPatch
) -> None:  # type: ignore[no-untyped-def]
    """`v` after Done, its child's `verified` event and exit drawn (the child is not started)."""
    started: list[list[str]] = []
    monkeypatch.setattr(Child, "start", lambda self: started.append(self.args))

    async def run(pilot: Pilot[object]) -> None:
        screen = await _finished(pilot)
        await pilot.press("v")
        assert screen.phase is Phase.VERIFYING and "verify" in started[-1]
        job = screen.plan
        assert job is not None
        screen.post_message(
            ChildEvent("verify", Verified(True, job.tensor_count, job.output_bytes, seconds=0.9))
        )
        screen.post_message(ChildExited("verify", 0, ""))
        await wait_for(pilot, lambda: screen.phase is Phase.VERIFIED, "verified")
        pilot.app.clear_notifications()  # a toast with a timeout (see _finished)
        await _settled(pilot)

    assert snap_compare(_app(snapshot_demo), terminal_size=size, run_before=run)


@SIZES
def test_quit_while_converting_asks(snap_compare, snapshot_demo: Path, size: tuple[int, int]) -> None:  # type: ignore[no-untyped-def]
    async def run(pilot: Pilot[object]) -> None:
        await _converting(pilot, 0.6)
        await pilot.press("q")
        await wait_for(pilot, lambda: isinstance(pilot.app.screen, ConfirmDialog), "the question")
        await _settled(pilot)

    assert snap_compare(_app(snapshot_demo), terminal_size=size, run_before=run)


NOT_A_CHECKPOINT = Path("/tmp/zero-inspector-snapshot-not-a-checkpoint")  # fixed: the dialog names it


@SIZES
def test_error_dialog(snap_compare, size: tuple[int, int]) -> None:  # type: ignore[no-untyped-def]
    """A folder with no checkpoint in it: the error dialog over the overview's banner."""
    NOT_A_CHECKPOINT.mkdir(exist_ok=True)
    (NOT_A_CHECKPOINT / "notes.txt").write_text("not a checkpoint\n")

    async def run(pilot: Pilot[object]) -> None:
        await wait_for(pilot, lambda: isinstance(pilot.app.screen, MessageDialog), "the error dialog")
        await pilot.app.workers.wait_for_complete()
        await _settled(pilot)

    assert snap_compare(_app(NOT_A_CHECKPOINT), terminal_size=size, run_before=run)


@SIZES
def test_tensor_stats(snap_compare, snapshot_demo: Path, size: tuple[int, int]) -> None:  # type: ignore[no-untyped-def]
    """`s` on a tensor: its statistics, histogram and the module copy's difference from the master."""

    async def run(pilot: Pilot[object]) -> None:
        app = pilot.app
        assert isinstance(app, InspectorApp)
        await _scanned(pilot)
        await pilot.press("t")
        assert app.main.tensors_pane.module_tree.reveal("model.layers.1.mlp.up_proj.weight")
        await pilot.pause()
        await pilot.press("s")
        detail = app.main.query_one(TensorDetail)
        await wait_for(pilot, lambda: "module copy vs master" in plain(detail), "the statistics")
        await app.workers.wait_for_complete()
        await _settled(pilot)

    assert snap_compare(_app(snapshot_demo), terminal_size=size, run_before=run)


@SIZES
def test_help(snap_compare, snapshot_demo: Path, size: tuple[int, int]) -> None:  # type: ignore[no-untyped-def]
    async def run(pilot: Pilot[object]) -> None:
        from inspector.tui.screens.help import HelpScreen

        await _scanned(pilot)
        await pilot.press("question_mark")
        await wait_for(
            pilot, lambda: isinstance(pilot.app.screen, HelpScreen) and pilot.app.screen.is_mounted, "help"
        )
        await _settled(pilot)

    assert snap_compare(_app(snapshot_demo), terminal_size=size, run_before=run)


def _keys_fit(bar: KeyBar, width: int) -> str:
    """The key bar's text, checked to fit `width` and to end on a whole label (the bar drops a whole entry, or
    a label everyone knows, rather than cut one)."""
    text = bar.render()
    assert hasattr(text, "plain")
    line = text.plain.rstrip()
    assert len(line) <= width and "…" not in line, line
    return line


@pytest.mark.asyncio
async def test_resize_follows_the_terminal_both_ways(snapshot_demo: Path) -> None:
    """Started at 80x24, enlarged to 120x36, shrunk back: the size classes, the summary card's columns, the
    Tensors tab (stacked when narrow, side by side when wide) and the key bar follow each resize. Classes
    or layouts decided once at startup (the issue: stacked after enlarging, cut rows after shrinking) fail."""
    app = _app(snapshot_demo)
    async with app.run_test(size=(80, 24)) as pilot:
        await _scanned(pilot)
        for width, height in [(80, 24), (120, 36), (80, 24)]:
            await pilot.resize_terminal(width, height)
            await _settled(pilot)
            screen = app.screen
            wide = width >= 100
            assert screen.has_class("wide") is wide and screen.has_class("narrow") is not wide
            assert screen.has_class("tall") is (height >= 32) and screen.has_class("short") is (height < 32)
            card = plain(app.main.query_one("SummaryCard"))
            zero_line = next(line for line in card.splitlines() if line.startswith("ZeRO"))
            assert ("fp32 masters" in card) and (("what" in zero_line) is wide), card  # two columns when wide
            assert "Convert" in _keys_fit(screen.query_one(KeyBar), width)

            await pilot.press("t")
            await pilot.pause()
            tree, detail = (
                app.main.query_one("#tree-column").region,
                app.main.query_one("#detail-column").region,
            )
            if wide:  # side by side, each full height, within the screen
                assert detail.x >= tree.right and detail.y == tree.y and detail.right <= width
            else:  # stacked, each full width
                assert detail.y >= tree.bottom and tree.width == detail.width == width
            assert detail.bottom <= height - 1  # above the key bar: no row cut
            keys = _keys_fit(screen.query_one(KeyBar), width)
            assert "Stats" in keys and ("Quit" in keys) is wide  # narrow: q's label goes, no label is cut
            await pilot.press("o")
            await pilot.pause()
