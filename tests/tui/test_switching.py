"""Switching checkpoints (#28 items 1, 2, 4): a switch forgets everything of the previous checkpoint, a refused
root or a missing tag leaves nothing exportable, and the other tags stay reachable."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from textual.widgets import Select

from inspector.tui.app import make_app
from inspector.tui.screens.convert import ConvertScreen
from inspector.tui.screens.dialogs import MessageDialog
from inspector.tui.screens.export import ExportScreen
from inspector.tui.session import ExportSettings
from tests.tui.conftest import plain, record_notes, saved_last, scanned, wait_for

pytestmark = pytest.mark.asyncio


def _refused_copy(src: Path, dest: Path) -> Path:
    """A copy of `src` whose model states are not a torch.save archive: a root the scan refuses outright
    (a stray layer file no longer does: it is read, and named in a finding)."""
    shutil.copytree(src, dest)
    tag = (dest / "latest").read_text().strip()
    (dest / tag / "mp_rank_00_model_states.pt").write_bytes(b"not a zip archive\n")
    return dest


async def _dismiss(pilot) -> str:  # type: ignore[no-untyped-def]
    """Close the error dialog; returns its title."""
    app = pilot.app
    await wait_for(
        pilot,
        lambda: isinstance(app.screen, MessageDialog) and bool(app.screen.query("#dialog-title")),
        "the error dialog",
    )
    title = plain(app.screen.query_one("#dialog-title"))
    await pilot.press("escape")
    await wait_for(pilot, lambda: not isinstance(app.screen, MessageDialog), "the dialog closed")
    return title


async def test_another_root_starts_with_everything_selected(
    small_demo: Path, two_tag_demo: Path, tmp_path: Path
) -> None:
    run = tmp_path / "run"
    run.mkdir()
    os.symlink(small_demo, run / "a")
    os.symlink(two_tag_demo, run / "b")
    saved_last(run / "a")
    app = make_app(path=str(run), live_meters=False)
    async with app.run_test(size=(120, 36)) as pilot:
        await scanned(pilot)
        assert app.root == str(run / "a")
        await pilot.press("t")
        tree = app.main.tensors_pane.module_tree
        tree.cursor_line = 0
        await pilot.press("n")  # nothing selected on a
        await pilot.press("space")  # only the first submodule
        assert app.selected and app.selected != {t.name for t in app.ckpt.tensors}
        await pilot.press("r")
        roots = app.main.query_one("#roots", Select)
        assert roots.expanded
        roots.value = str(run / "b")
        await wait_for(pilot, lambda: app.ckpt is not None and app.ckpt.root == str(run / "b"), "switch")
        assert app.selected == {t.name for t in app.ckpt.tensors}
        opts = app.convert_options()
        assert opts.include == () and opts.exclude == ()
        assert app.export.out_dir == ExportSettings.default_out(str(run / "b"), app.ckpt.tag)
        assert "--include" not in plain(app.main.query_one("#selection-line"))


async def test_another_tag_says_what_selection_it_kept(two_tag_demo: Path) -> None:
    app = make_app(path=str(two_tag_demo), live_meters=False)
    async with app.run_test(size=(120, 36)) as pilot:
        await scanned(pilot)
        first_out = app.export.out_dir
        assert "global_step5" in first_out
        await pilot.press("t", "n")
        tree = app.main.tensors_pane.module_tree
        tree.cursor_line = 0
        await pilot.press("space")
        chosen = set(app.selected)
        told = record_notes(app)
        await pilot.press("left_square_bracket")
        await wait_for(pilot, lambda: app.ckpt is not None and app.ckpt.tag == "global_step3", "tag switch")
        assert app.selected == chosen
        assert any(t.title == "Selection carried over" for t in told)
        # the proposed folder follows the tag (it was never typed by the user)
        assert app.export.out_dir == ExportSettings.default_out(str(two_tag_demo), "global_step3")


async def test_refused_root_clears_every_view(small_demo: Path, tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    os.symlink(small_demo, run / "a")
    _refused_copy(small_demo, run / "p")
    saved_last(run / "a")
    app = make_app(path=str(run), live_meters=False)
    async with app.run_test(size=(120, 36)) as pilot:
        await scanned(pilot)
        assert app.root == str(run / "a")
        await pilot.press("h")  # a health pass of a
        await pilot.press("o")
        app.main.query_one("#roots", Select).value = str(run / "p")
        await _dismiss(pilot)
        assert app.ckpt is None and app.selected == set()
        assert "mp_rank_00_model_states.pt" in plain(app.main.query_one("#banner"))
        assert plain(app.main.query_one("SummaryCard")).strip() == ""
        assert plain(app.main.query_one("RanksView")).strip() == ""
        assert plain(app.main.query_one("#tag-list")).strip() == ""
        pane = app.main.tensors_pane
        assert pane.ckpt is None and not pane.module_tree.root.children
        assert app.main.health_pane.ckpt is None and not app.main.health_pane.table.entries
        await pilot.press("t")
        await pilot.press("e")
        assert not isinstance(app.screen, ExportScreen)
        await pilot.press("c")
        await pilot.pause()
        assert not isinstance(app.screen, ConvertScreen)
        # back to a readable root: everything works again, for that root
        app.main.query_one("#roots", Select).value = str(run / "a")
        await wait_for(pilot, lambda: app.ckpt is not None, "the scan of a")
        await pilot.press("e")
        assert isinstance(app.screen, ExportScreen)
        assert app.export.out_dir == ExportSettings.default_out(str(run / "a"), app.ckpt.tag)


async def test_roots_and_tags_switch_only_from_the_main_screen(two_tag_demo: Path) -> None:
    app = make_app(path=str(two_tag_demo), live_meters=False)
    async with app.run_test(size=(120, 36)) as pilot:
        await scanned(pilot)
        await pilot.press("e")
        assert isinstance(app.screen, ExportScreen)
        app.action_tag(-1)  # `[` from the palette or an unfocused field
        await pilot.pause()
        assert app.ckpt is not None and app.ckpt.tag == "global_step5"


async def test_missing_tag_leaves_the_others_choosable(two_tag_demo: Path) -> None:
    app = make_app(path=str(two_tag_demo), tag="global_step9", live_meters=False)
    async with app.run_test(size=(120, 36)) as pilot:
        assert "No such tag" in await _dismiss(pilot)  # not "Not a DeepSpeed checkpoint"
        assert app.ckpt is None
        tags = app.main.query_one("#tags", Select)
        await wait_for(pilot, lambda: len(tags._options) > 1, "the tag list")
        assert {v for _, v in tags._options if isinstance(v, str)} == {"global_step3", "global_step5"}
        assert "[ and ]" in plain(app.main.query_one("#banner"))
        await pilot.press("right_square_bracket")
        await wait_for(pilot, lambda: app.ckpt is not None, "the latest tag")
        assert app.ckpt.tag == "global_step5"
        await pilot.press("left_square_bracket")
        await wait_for(pilot, lambda: app.ckpt is not None and app.ckpt.tag == "global_step3", "the older")
