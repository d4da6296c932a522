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


def test_saved_per_root_narrowed_to_the_tag_and_checked(demo, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    from inspector.demo.writer import DemoSpec
    from inspector.scan.scanner import scan

    ckpt = scan(str(demo(DemoSpec(params=2_000_000))))
    x, y = ckpt.tensors[0].name, ckpt.tensors[1].name
    named = NamedSelections(folder=str(tmp_path / "state"))
    assert named.save(ckpt.root, " stage 1 ", {x, "not.in.this.tag"}) == ""
    assert named.save("/runs/b", "stage 1", {y}) == ""
    assert named.names(ckpt.root) == ["stage 1"] and named.names("/runs/c") == []
    assert named.pick(ckpt, "stage 1") == {x}  # another tag lacks the other one
    for bad in ("", "   ", "x" * 41, "a\x1bb"):
        with pytest.raises(InvalidOptionError):
            named.save(ckpt.root, bad, {x})
    with pytest.raises(InvalidOptionError):
        named.save(ckpt.root, "empty", set())
    again = NamedSelections(folder=str(tmp_path / "state"))  # the next run of the app
    assert again.load() == "" and again.names(ckpt.root) == ["stage 1"] and again.pick(ckpt, "stage 1") == {x}
    other = NamedSelections(folder=str(tmp_path / "state"))  # two apps open at once, each saving one
    other.load()
    assert again.save(ckpt.root, "mine", {x}) == "" and other.save(ckpt.root, "theirs", {y}) == ""
    last = NamedSelections(folder=str(tmp_path / "state"))
    assert last.load() == "" and last.names(ckpt.root) == ["stage 1", "mine", "theirs"]  # neither lost


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
        assert app.ckpt is not None and app.named.names(app.ckpt.root) == ["layer 1"]
        assert app.named.pick(app.ckpt, "layer 1") == wanted

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
