"""The small cuts a first session trips on (issue 18, item 13): counts in words, names that fit, palette
entries that say which is which, keys that say when they cannot act, help that says what it covers and that it
scrolls, checkboxes and scrollbars that can be seen. Each is checked as a user sees it: the text on screen,
the notification, the colours drawn."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from textual.color import Color
from textual.widgets import Checkbox

from inspector.demo.writer import DemoSpec
from inspector.tui.app import make_app
from inspector.tui.fmt import fit_path
from inspector.tui.screens.help import HelpScreen
from inspector.tui.screens.overview import OverviewPane
from inspector.tui.widgets.ranks import RanksView
from tests.tui.conftest import plain, record_notes, scanned

if TYPE_CHECKING:
    from conftest import DemoCache

pytestmark = pytest.mark.asyncio

ONE_RANK = DemoSpec(world_size=1, params=300_000)


async def test_one_rank_is_said_in_the_singular(demo: DemoCache) -> None:
    """The status bar and the overview say "1 rank", and so does `scan`."""
    root = demo(ONE_RANK)
    app = make_app(path=str(root), live_meters=False)
    async with app.run_test(size=(120, 36)) as pilot:
        await scanned(pilot)
        status = plain(app.main.query_one("#status"))
        assert "1 rank ·" in status and "ranks" not in status
        assert "1 rank ·" in plain(app.main.query_one("SummaryCard"))
        await pilot.press("t")
        tree = app.main.tensors_pane.module_tree
        assert tree.reveal("model.layers.0.mlp.up_proj.weight")
        await pilot.pause()
        assert "split 1 way)" in plain(app.main.tensors_pane.detail)
    env = dict(os.environ, COLUMNS="120", NO_COLOR="1")
    out = subprocess.run(
        [sys.executable, "-m", "inspector", "scan", str(root)],
        capture_output=True,
        text=True,
        env=env,
        check=True,
    ).stdout
    assert "1 rank ·" in out and "1 ranks" not in out
    ckpt_files = [os.path.basename(f) for f in (app.ckpt.ranks[0].optim_file, app.ckpt.ranks[0].model_file)]  # type: ignore[union-attr]
    assert all(f in out for f in ckpt_files if f)  # whole in scan's ranks table too, not cut with …


@pytest.mark.filterwarnings("ignore::pytest.PytestWarning")  # a plain function in an asyncio-marked module
def test_fit_path_keeps_the_end_of_the_path() -> None:
    path = "/data/experiments/llama-3-8b-sft-long-context-run-0042/checkpoints/demo-checkpoint"
    assert fit_path(path, len(path)) == path
    assert fit_path(path, 40) == "…/checkpoints/demo-checkpoint"
    assert fit_path(path, 20) == "…/demo-checkpoint"
    assert fit_path(path, 10) == "…heckpoint"  # not even the name fits: its end
    assert all(len(fit_path(path, w)) <= w for w in range(2, 90))


async def test_title_keeps_the_tag_whole_at_every_width(small_demo: Path, tmp_path: Path) -> None:
    """A long root gives way in the header (`…/run/checkpoint`), so `@ global_step…` is never cut; a resize
    fits it again."""
    deep = tmp_path / ("a-rather-long-experiment-folder-name-" * 2) / "run-0042" / "demo-checkpoint"
    deep.parent.mkdir(parents=True)
    deep.symlink_to(small_demo, target_is_directory=True)
    app = make_app(path=str(deep), live_meters=False)
    async with app.run_test(size=(120, 36)) as pilot:
        await scanned(pilot)
        for width in (120, 80, 160):
            await pilot.resize_terminal(width, 36)
            await pilot.pause()
            title = app.main.sub_title
            assert title.endswith("demo-checkpoint @ global_step3"), title
            assert len(f"zero-inspector — {title}") <= width - 18  # between Textual's icon and clock space
        assert len(app.main.sub_title) > len(fit_path(str(deep), 80 - 55))  # wider: more of the path


async def test_rank_file_names_are_whole_at_120_columns(small_demo: Path) -> None:
    app = make_app(path=str(small_demo), live_meters=False)
    async with app.run_test(size=(120, 36)) as pilot:
        await scanned(pilot)
        assert app.ckpt is not None
        shown = plain(app.main.query_one(RanksView))
        for r in app.ckpt.ranks:
            for f in (r.optim_file, r.model_file):
                if f:
                    assert os.path.basename(f) in shown, shown


async def test_palette_entries_have_distinct_names(small_demo: Path) -> None:
    app = make_app(path=str(small_demo), live_meters=False)
    async with app.run_test(size=(120, 36)) as pilot:
        await scanned(pilot)
        titles = [c.title for c in app.get_system_commands(app.screen)]
        assert len(titles) == len(set(titles)), titles
        assert "Help: every key" in titles and "Key panel" in titles


async def test_tag_keys_say_when_there_is_no_other_tag(two_tag_demo: Path, small_demo: Path) -> None:
    app = make_app(path=str(two_tag_demo), live_meters=False)
    told = record_notes(app)
    async with app.run_test(size=(120, 36)) as pilot:
        await scanned(pilot)
        await pilot.press("right_square_bracket")  # already at the newest
        assert "Already the newest tag (2 in all)." in [n.message for n in told]
    app = make_app(path=str(small_demo), live_meters=False)
    told = record_notes(app)
    async with app.run_test(size=(120, 36)) as pilot:
        await scanned(pilot)
        await pilot.press("left_square_bracket")
        assert any("one tag" in n.message for n in told)


async def test_help_says_it_scrolls_and_where_q_types(small_demo: Path) -> None:
    """At 80x24 the keys do not fit: the box's border says more is below, and says the end at the end; the
    text says `q` is typed in a text field."""
    app = make_app(path=str(small_demo), live_meters=False)
    async with app.run_test(size=(80, 24)) as pilot:
        await scanned(pilot)
        await pilot.press("question_mark")
        assert isinstance(app.screen, HelpScreen)
        box = app.screen.query_one("#help-box")
        assert "more below" in str(box.border_subtitle) and "pgdn" in str(box.border_subtitle)
        assert "in a text field" in plain(box.query_one("Static"))
        await pilot.press("end")
        await pilot.pause(0.3)
        assert str(box.border_subtitle).startswith("end"), box.border_subtitle


def _apart(a: Color, b: Color) -> float:
    return abs(a.brightness - b.brightness)


async def test_unchecked_boxes_and_scrollbars_stand_out(small_demo: Path) -> None:
    """In the default theme an unchecked box is drawn apart from the form behind it, and a scrollbar's thumb
    apart from its track and from the pane."""
    app = make_app(path=str(small_demo), live_meters=False)
    async with app.run_test(size=(80, 24)) as pilot:
        await scanned(pilot)
        pane = app.main.query_one(OverviewPane)
        thumb, track = pane.styles.scrollbar_color, pane.styles.scrollbar_background
        _, behind = pane.background_colors
        assert _apart(behind + thumb, behind + track) > 0.15 and _apart(behind + track, behind) > 0.03
        await pilot.press("e")
        await pilot.pause()
        box = app.screen.query(Checkbox).first()
        assert not box.value
        button = box.get_component_styles("toggle--button")
        _, under = box.background_colors
        assert _apart(under + button.background, under) > 0.15
