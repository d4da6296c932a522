"""Snapshots of the screens issue 42 fixed, at 80x24 and 120x36 (the same frozen figures and fixed paths as
`test_snapshots`): the flat table with the name first and its middle elided, the export form's Base model
field for a merge with the CLI's remedy pointed at it, a finished Convert screen narrowed from 120x36 to 80x24."""

from __future__ import annotations

from pathlib import Path

import pytest
from textual.pilot import Pilot
from textual.widgets import Select

from tests.tui.conftest import fixed_copy, plain, wait_for
from tests.tui.test_snapshots import SIZES, _app, _finished, _scanned, _settled

LORA = Path(__file__).parents[1] / "fixtures" / "trainer_lora" / "run"


@pytest.fixture(scope="session")
def snapshot_lora() -> Path:
    """The Trainer LoRA run at a fixed path; its adapter_config names `base_llama`, no folder from here."""
    return fixed_copy(LORA, "zero-inspector-snapshot-lora")


@SIZES
def test_flat_table(snap_compare, snapshot_demo: Path, size: tuple[int, int]) -> None:  # type: ignore[no-untyped-def]
    async def run(pilot: Pilot[object]) -> None:
        await _scanned(pilot)
        await pilot.press("t", "f")
        await _settled(pilot)

    assert snap_compare(_app(snapshot_demo), terminal_size=size, run_before=run)


@SIZES
def test_export_merge_asks_for_the_base(snap_compare, snapshot_lora: Path, size: tuple[int, int], monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.chdir(snapshot_lora)  # the refusal names the folder a relative base is read from: fixed here

    async def run(pilot: Pilot[object]) -> None:
        await _scanned(pilot)
        await pilot.press("e")
        form = pilot.app.screen
        form.query_one("#format", Select).value = "merged"
        await wait_for(
            pilot, lambda: "Base model not usable" in plain(form.query_one("#form-errors")), "refusal"
        )
        await _settled(pilot)

    assert snap_compare(_app(snapshot_lora), terminal_size=size, run_before=run)


async def _narrowed(pilot: Pilot[object]) -> None:
    """A conversion finished at 120x36, then the terminal narrowed to 80x24 (issue 42 item 8)."""
    await _finished(pilot)
    await _settled(pilot)
    await pilot.resize_terminal(80, 24)
    await _settled(pilot)


@pytest.mark.asyncio
async def test_finished_convert_meters_reflow_when_narrowed(snapshot_demo: Path) -> None:
    """No meter keeps the width it was drawn at: after the resize every line of the memory meter (bar and
    sparkline) is as wide as the meter is now, nothing wraps onto a line of its own (a 120-column bar at 80
    columns wrapped into a line of dots)."""
    app = _app(snapshot_demo)
    async with app.run_test(size=(120, 36)) as pilot:
        await _narrowed(pilot)
        meter = app.screen.query_one("#meter")
        width = meter.size.width
        assert 0 < width <= 80
        lines = [
            *plain(meter.query_one("#meter-text")).splitlines(),
            *plain(meter.query_one("#meter-spark")).splitlines(),
        ]
        assert len(lines) == 4, lines  # figures, bar, two sparkline rows: none wrapped
        bar, *spark = lines[1:]
        assert len(bar) == width - 2 and "│" in bar, bar
        assert all(len(row) == width - 2 for row in spark), spark


def test_convert_done_narrowed(snap_compare, snapshot_demo: Path) -> None:  # type: ignore[no-untyped-def]
    assert snap_compare(_app(snapshot_demo), terminal_size=(120, 36), run_before=_narrowed)
