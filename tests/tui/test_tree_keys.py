"""The tree's keys (#28 items 5, 7, 16): → → arriving together unfold then step in; enter on a hidden row."""

from __future__ import annotations

from pathlib import Path

import pytest
from textual import events

from inspector.scan.model import TensorInfo
from inspector.tui.app import make_app
from inspector.tui.session import ModuleNode
from tests.tui.conftest import scanned

pytestmark = pytest.mark.asyncio


def _folded(tree):  # type: ignore[no-untyped-def]
    """The first folded submodule row."""
    for line in range(tree.last_line + 1):
        node = tree.get_node_at_line(line)
        if node is not None and isinstance(node.data, ModuleNode) and not node.is_expanded and node.children:
            return node
    raise AssertionError("no folded submodule")


async def test_right_right_steps_into_the_first_child(small_demo: Path) -> None:
    app = make_app(path=str(small_demo), live_meters=False)
    async with app.run_test(size=(120, 36)) as pilot:
        await scanned(pilot)
        await pilot.press("t")
        tree = app.main.tensors_pane.module_tree
        node = _folded(tree)
        tree.move_cursor(node)
        await pilot.pause()
        # both keys queued before the tree redraws, as a key repeat delivers them
        app.post_message(events.Key("right", None))
        app.post_message(events.Key("right", None))
        await pilot.pause()
        await pilot.pause()
        assert node.is_expanded
        assert tree.cursor_node is node.children[0], tree.cursor_node and tree.cursor_node.data


async def test_health_focus_after_a_and_enter_on_a_filtered_row(small_demo: Path) -> None:
    """#28 item 7: the table has the keys again once the comparison menu closes; enter on a health row that the
    Tensors filter hides clears the filter and puts the cursor on that tensor."""
    from textual.widgets import Select

    from tests.tui.conftest import wait_for

    app = make_app(path=str(small_demo), live_meters=False)
    async with app.run_test(size=(120, 36)) as pilot:
        await scanned(pilot)
        await pilot.press("t", "slash", *"q_proj", "enter")  # a filter that hides most tensors
        await pilot.press("h")
        pane = app.main.health_pane
        await wait_for(pilot, lambda: pane.report is not None, "the health pass")
        await pilot.press("a")
        select = pane.query_one("#health-against", Select)
        assert select.expanded
        await pilot.press("escape")
        await pilot.pause()
        assert not select.expanded and app.focused is pane.table
        entries = pane.table.entries
        target = next(i for i, e in enumerate(pane.table.entries) if "q_proj" not in e.row.name)
        pane.table.move_cursor(row=target)
        name = pane.table.entry_at_cursor().row.name
        await pilot.press("enter")
        tree = app.main.tensors_pane.module_tree
        await wait_for(
            pilot,
            lambda: isinstance(tree.cursor_node and tree.cursor_node.data, TensorInfo)
            and tree.cursor_node.data.name == name,
            "the cursor on the tensor",
        )
        assert tree.pattern is None and entries


async def test_j_k_g_G_and_find_in_every_list(small_demo: Path) -> None:
    """#28 item 16: the tree and the health table move with j/k/g/G; `/` on the Health tab finds a row."""
    from tests.tui.conftest import wait_for

    app = make_app(path=str(small_demo), live_meters=False)
    async with app.run_test(size=(80, 24)) as pilot:
        await scanned(pilot)
        await pilot.press("t")
        tree = app.main.tensors_pane.module_tree
        await pilot.press("j", "j")
        assert tree.cursor_line == 2
        await pilot.press("k")
        assert tree.cursor_line == 1
        await pilot.press("G")
        assert tree.cursor_line == tree.last_line > 1
        await pilot.press("g")
        assert tree.cursor_line == 0
        await pilot.press("h")
        pane = app.main.health_pane
        await wait_for(pilot, lambda: pane.report is not None, "the health pass")
        table = pane.table
        await pilot.press("G")
        assert table.cursor_row == table.row_count - 1
        await pilot.press("g", "j")
        assert table.cursor_row == 1
        await pilot.press("slash", *"down_proj", "enter")
        entry = table.entry_at_cursor()
        assert entry is not None and "down_proj" in entry.row.name
        assert app.focused is table
