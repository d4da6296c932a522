"""The app as people use it (issue: keyboard from launch, scrolling, filters that say what they did, cursor and
detail in step)."""

from __future__ import annotations

from pathlib import Path

import pytest
from textual.widgets import Input

from inspector.tui.app import make_app
from inspector.tui.screens.overview import OverviewPane
from inspector.tui.widgets.module_tree import ModuleTree
from inspector.tui.widgets.tensor_detail import TensorDetail
from tests.tui.conftest import plain, record_notes, scanned

pytestmark = pytest.mark.asyncio


async def test_keys_work_from_launch_and_the_overview_scrolls(small_demo: Path) -> None:
    """`↓` right after launch scrolls the overview (not into the hidden tag dropdown); PageDown/End reach the
    sections below the fold at 80x24; `t` then reaches the tree."""
    app = make_app(path=str(small_demo), live_meters=False)
    async with app.run_test(size=(80, 24)) as pilot:
        await scanned(pilot)
        pane = app.main.query_one(OverviewPane)
        assert app.focused is pane
        await pilot.press("down")
        assert app.focused is pane and pane.scroll_y > 0
        await pilot.press("end")
        await pilot.pause()
        assert pane.max_scroll_y > 0 and pane.scroll_y == pane.max_scroll_y
        await pilot.press("t")
        assert isinstance(app.focused, ModuleTree)


async def test_filter_says_how_it_read_the_text_and_how_many_match(small_demo: Path) -> None:
    """A regex with a character class is a regex (not a glob that matches nothing); no match is said in words;
    the cursor and the detail follow the filtered tree."""
    app = make_app(path=str(small_demo), live_meters=False)
    async with app.run_test(size=(120, 36)) as pilot:
        await scanned(pilot)
        await pilot.press("t")
        tree = app.main.query_one(ModuleTree)
        detail = app.main.query_one(TensorDetail)
        assert tree.cursor_line == 0 and tree.cursor_node is not None
        assert plain(detail).startswith(tree.cursor_node.data.path)  # the row under the cursor, not another
        await pilot.press("slash")
        box = app.main.query_one("#filter", Input)
        box.value = r"^model\.layers\.[13]\.mlp"
        await pilot.pause()
        line = plain(app.main.query_one("#selection-line"))
        expected = [
            t for t in app.ckpt.tensors if t.name.startswith(("model.layers.1.mlp", "model.layers.3.mlp"))
        ]  # type: ignore[union-attr]
        assert expected and f"regex: {len(expected)} of" in line, line
        assert tree.cursor_node is not None and tree.cursor_line == 0
        assert f"{len(expected)} tensors" in plain(detail)  # the filtered subtree, not the unfiltered count
        box.value = "no_such_thing"
        await pilot.pause()
        assert "no tensor matches this text" in plain(app.main.query_one("#selection-line"))
        assert "No tensor matches" in plain(detail)


async def test_resizing_restyles_the_tensors_tab(small_demo: Path) -> None:
    """Started narrow then enlarged, the Tensors tab goes side by side; shrunk again, it stacks."""
    from inspector.tui.screens.tensors import TensorsPane

    app = make_app(path=str(small_demo), live_meters=False)
    async with app.run_test(size=(80, 24)) as pilot:
        await scanned(pilot)
        await pilot.press("t")
        pane = app.main.query_one(TensorsPane)
        assert app.main.has_class("narrow") and pane.styles.layout.name == "vertical"
        await pilot.resize_terminal(160, 48)
        await pilot.pause(0.2)
        assert app.main.has_class("wide") and pane.styles.layout.name == "horizontal"
        await pilot.resize_terminal(80, 24)
        await pilot.pause(0.2)
        assert app.main.has_class("narrow") and pane.styles.layout.name == "vertical"


async def test_the_peak_shown_is_the_converters_own(small_demo: Path, tmp_path: Path) -> None:
    """The converter child inherits getrusage's high-water mark from the app across fork and exec: the peak
    shown must be the child's own (VmHWM), not the app's, however big the app has grown."""
    from inspector.tui.screens.convert import ConvertScreen
    from inspector.tui.widgets.meter import MemoryMeter
    from tests.tui.conftest import wait_for

    ballast = bytearray(300 * 2**20)
    ballast[::4096] = b"\x01" * len(range(0, len(ballast), 4096))  # resident in this (the app's) process
    app = make_app(path=str(small_demo), out_dir=str(tmp_path / "out"), live_meters=False)
    async with app.run_test(size=(120, 36)) as pilot:
        await scanned(pilot)
        await pilot.press("c")
        await wait_for(
            pilot,
            lambda: isinstance(app.screen, ConvertScreen) and app.screen.report is not None,
            "conversion",
        )
        peak = app.screen.report.peak_rss  # type: ignore[union-attr]
        assert 0 < peak < 200 * 2**20, peak
        assert app.screen.query_one(MemoryMeter).peak < 200 * 2**20
    del ballast


async def test_c_into_a_folder_that_is_not_empty_points_at_the_form(small_demo: Path, tmp_path: Path) -> None:
    """`c` on the main screen with an output folder the form marks "not empty" does not start a conversion that
    would fail with the CLI's words: it opens the form, whose checkbox is the answer."""
    from inspector.tui.screens.convert import ConvertScreen
    from inspector.tui.screens.export import ExportScreen

    out = tmp_path / "out"
    out.mkdir()
    (out / "model.safetensors").write_bytes(b"earlier")
    app = make_app(path=str(small_demo), out_dir=str(out), live_meters=False)
    told = record_notes(app)
    async with app.run_test(size=(120, 36)) as pilot:
        await scanned(pilot)
        await pilot.press("c")
        await pilot.pause()
        assert isinstance(app.screen, ExportScreen) and not app.converting
        assert not any(isinstance(s, ConvertScreen) for s in app.screen_stack)
        assert any("not empty" in n.message and "replace an earlier" in n.message for n in told)
    assert (out / "model.safetensors").read_bytes() == b"earlier"


async def test_a_folder_name_with_escapes_is_shown_escaped(small_demo: Path, tmp_path: Path) -> None:
    """The header and status show a crafted folder name with its control characters escaped."""
    import shutil

    root = tmp_path / "ckpt\x1b]2;PWNED\x07"
    shutil.copytree(small_demo, root)
    app = make_app(path=str(root), live_meters=False)
    async with app.run_test(size=(200, 36)) as pilot:
        await scanned(pilot)
        assert "\\x1b]2;PWNED\\x07" in app.main.sub_title and "\x1b" not in app.main.sub_title
        assert "\x1b" not in app.screen.query_one("#status").render().plain  # type: ignore[attr-defined]


async def test_keys_typed_right_after_slash_go_to_the_filter(small_demo: Path) -> None:
    """`/nlayers` typed in one burst (a fast typist, a paste, tmux) reaches the app before the filter box can take
    the focus: every key after `/` is typed into the filter, none selects (`n`), opens the export form (`e`)
    or quits (`q`); `enter` then hands the keys back to the tree, and escape clears the filter."""
    from textual import events

    from inspector.tui.screens.main import MainScreen

    app = make_app(path=str(small_demo), live_meters=False)
    async with app.run_test(size=(120, 36)) as pilot:
        await scanned(pilot)
        await pilot.press("t")
        selected = set(app.selected)
        for ch in "/nlayers.qe":  # as the terminal driver delivers a burst: all queued before any is handled
            app.post_message(events.Key("slash" if ch == "/" else ch, ch))
        app.post_message(events.Key("backspace", None))
        await pilot.pause()
        await pilot.pause()
        box = app.main.query_one("#filter", Input)
        assert box.value == "nlayers.q" and app.focused is box
        assert isinstance(app.screen, MainScreen) and app.is_running and app.selected == selected
        await pilot.press("enter")
        assert isinstance(app.focused, ModuleTree)
        await pilot.press("escape")
        assert box.value == "" and box.has_class("-hidden")
        await pilot.press("n")  # the tree's key again: select none
        assert app.selected == set()
