"""Named selections (issue 42, the day-three wish list): `m` saves what `e` would export under a name, per
root, kept across tags; the Export form's Selection field picks one, and the preflight and the export take
exactly it."""

from __future__ import annotations

from pathlib import Path

import pytest
from textual.widgets import Input, Select

from inspector.errors import InvalidOptionError
from inspector.tui.app import make_app
from inspector.tui.screens.dialogs import NameDialog
from inspector.tui.screens.export import ExportScreen
from inspector.tui.selections import NamedSelections
from tests.tui.conftest import plain, scanned, wait_for


def test_saved_per_root_narrowed_to_the_tag_and_checked() -> None:
    named = NamedSelections()
    named.save("/runs/a", " stage 1 ", {"x", "y"})
    named.save("/runs/b", "stage 1", {"z"})
    assert named.names("/runs/a") == ["stage 1"] and named.names("/runs/c") == []
    assert named.pick("/runs/a", "stage 1", {"x", "q"}) == {"x"}  # another tag lacks y
    for bad in ("", "   ", "x" * 41, "a\x1bb"):
        with pytest.raises(InvalidOptionError):
            named.save("/runs/a", bad, {"x"})
    with pytest.raises(InvalidOptionError):
        named.save("/runs/a", "empty", set())


@pytest.mark.asyncio
async def test_m_saves_and_the_export_form_picks_it(small_demo: Path, tmp_path: Path) -> None:
    app = make_app(path=str(small_demo), out_dir=str(tmp_path / "out"), live_meters=False)
    async with app.run_test(size=(120, 36)) as pilot:
        await scanned(pilot)
        everything = set(app.selected)
        await pilot.press("t", "slash", *"layers.1.", "enter")  # the filter: e would export what it shows
        await pilot.pause()
        assert app.shown_only is not None
        wanted = everything & set(app.shown_only)
        assert wanted and wanted != everything
        await pilot.press("m")
        await wait_for(pilot, lambda: isinstance(app.screen, NameDialog), "the name dialog")
        app.screen.query_one(Input).value = "layer 1"
        await pilot.press("enter")
        await wait_for(pilot, lambda: not isinstance(app.screen, NameDialog), "saved")
        assert app.named.names(app.root) == ["layer 1"]
        assert app.named.pick(app.root, "layer 1", everything) == wanted

        await pilot.press("escape", "a")  # the filter off, everything selected again
        await pilot.pause()
        assert app.shown_only is None and app.selected == everything
        await pilot.press("e")
        await wait_for(pilot, lambda: isinstance(app.screen, ExportScreen), "the form")
        field = app.screen.query_one("#named", Select)
        assert field.value == ""  # the Tensors tab's choice is the default
        field.value = "layer 1"
        await wait_for(pilot, lambda: app.selected == wanted, "the saved selection in force")
        assert app.main.tensors_pane.module_tree.selected == wanted
        form = app.screen
        summary = f"Selection: {len(wanted)} tensors"
        await wait_for(pilot, lambda: summary in plain(form.query_one("#selection-summary")), "its preflight")
