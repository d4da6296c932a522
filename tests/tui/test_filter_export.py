"""The filter drives the export (#42 item 4, k9s/lazygit): what `/` shows of the selection is what `e` and `c`
export; `↓` leaves the filter box for the list, the filter kept; `↑` in the box recalls earlier filters."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from textual.widgets import Input

from inspector.convert.options import select
from inspector.tui.app import make_app
from inspector.tui.screens.export import ExportScreen
from inspector.tui.session import exported
from tests.tui.conftest import converted, plain, scanned, wait_for

pytestmark = pytest.mark.asyncio


async def test_exported_is_the_selection_the_filter_shows() -> None:
    assert exported({"a", "b"}, None) == {"a", "b"}
    assert exported({"a", "b"}, frozenset({"b", "c"})) == {"b"}


async def test_filter_then_e_exports_what_it_shows(small_demo: Path, tmp_path: Path, cli: Any) -> None:
    by_app = tmp_path / "app"
    app = make_app(path=str(small_demo), out_dir=str(by_app), live_meters=False)
    async with app.run_test(size=(120, 36)) as pilot:
        await scanned(pilot)
        await pilot.press("t", "slash", *"q_proj", "down")  # ↓: out of the box, onto the tree
        pane = app.main.tensors_pane
        box = pane.query_one("#filter", Input)
        assert app.focused is pane.module_tree and box.value == "q_proj"
        shown = {t.name for t in pane.module_tree.shown_tensors()}
        assert shown and all("q_proj" in n for n in shown) and len(shown) < len(app.ckpt.tensors)
        assert app.shown_only == shown
        opts = app.convert_options()
        assert {t.name for t in select(app.ckpt, opts)} == shown
        assert "what e exports" in plain(pane.query_one("#selection-line"))
        await pilot.press("e")
        form = app.screen
        assert isinstance(form, ExportScreen)
        summary = form.query_one("#selection-summary")
        await wait_for(
            pilot, lambda: f"Selection: {len(shown)} tensors" in plain(summary), "the filtered plan"
        )
        await pilot.press("escape")
        assert await converted(pilot) == "done"
    by_cli = tmp_path / "cli"
    fmt = app.export.format or "model"
    include = [a for p in opts.include for a in ("--include", p)]  # the header records the flags given
    assert cli("convert", small_demo, by_cli, "--format", fmt, *include).rc == 0
    names = sorted(p.name for p in by_cli.iterdir() if not p.name.startswith("."))
    assert names == sorted(p.name for p in by_app.iterdir() if not p.name.startswith("."))
    assert all((by_app / n).read_bytes() == (by_cli / n).read_bytes() for n in names)


async def test_escape_clears_the_filter_and_the_export_takes_everything_again(small_demo: Path) -> None:
    app = make_app(path=str(small_demo), live_meters=False)
    async with app.run_test(size=(80, 24)) as pilot:
        await scanned(pilot)
        await pilot.press("t", "slash", *"k_proj", "enter")
        assert app.shown_only is not None
        await pilot.press("escape")
        assert app.shown_only is None
        assert {t.name for t in select(app.ckpt, app.convert_options())} == {t.name for t in app.ckpt.tensors}


async def test_up_in_the_box_recalls_earlier_filters(small_demo: Path) -> None:
    app = make_app(path=str(small_demo), live_meters=False)
    async with app.run_test(size=(120, 36)) as pilot:
        await scanned(pilot)
        await pilot.press("t", "slash", *"q_proj", "enter", "slash")
        box = app.main.tensors_pane.query_one("#filter", Input)
        box.value = ""
        await pilot.press(*"v_proj", "enter", "slash")
        box.value = ""
        await pilot.press("up")
        assert box.value == "v_proj"
        await pilot.press("up")
        assert box.value == "q_proj"
        await pilot.press("up")
        assert box.value == "q_proj"  # the oldest stays


async def test_v_marks_a_range_of_the_flat_table(small_demo: Path) -> None:
    app = make_app(path=str(small_demo), live_meters=False)
    async with app.run_test(size=(120, 36)) as pilot:
        await scanned(pilot)
        await pilot.press("t", "f")
        app.main.tensors_pane.module_tree.set_selection(set())
        await pilot.pause()
        table = app.main.tensors_pane.flat
        await pilot.press("g", "down", "v", "down", "down", "v")
        rows = [str(table.coordinate_to_cell_key((r, 0)).row_key.value) for r in (1, 2, 3)]
        await pilot.pause()
        assert app.selected == set(rows)


async def test_fits_in_ram_judges_a_chosen_node(small_demo: Path, tmp_path: Path, cli: Any) -> None:
    """The form's "Fits in RAM" is `preflight --ram`: the same budget and verdict (#42 item 6)."""
    import json

    app = make_app(path=str(small_demo), out_dir=str(tmp_path / "out"), live_meters=False)
    async with app.run_test(size=(120, 36)) as pilot:
        await scanned(pilot)
        await pilot.press("e")
        form = app.screen
        panel = form.query_one("#preflight")
        form.query_one("#ram", Input).value = "1MB"
        await wait_for(pilot, lambda: "--ram 1MB" in plain(panel), "the node's verdict")
        assert panel.assessment is not None and not panel.assessment.fits
        by_cli = json.loads(cli("preflight", small_demo, "--json", "--ram", "1MB").stdout)
        assert panel.assessment.budget.effective.bytes == by_cli["available_memory_bytes"] == 10**6
        assert panel.assessment.predicted_peak_rss == by_cli["predicted_peak_rss_bytes"]
        form.query_one("#ram", Input).value = "lots"
        await wait_for(pilot, lambda: "Fits in RAM" in plain(form.query_one("#form-errors")), "the bad size")
