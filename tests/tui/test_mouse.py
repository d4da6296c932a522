"""Mouse selection in the module tree: a click on a row's mark toggles it, a click elsewhere does not."""

from __future__ import annotations

from pathlib import Path

import pytest
from rich.cells import cell_len
from textual.pilot import Pilot

from inspector.scan.model import TensorInfo
from inspector.tui.app import make_app
from inspector.tui.session import ModuleNode
from inspector.tui.widgets.module_tree import ModuleTree
from tests.tui.conftest import scanned

pytestmark = pytest.mark.asyncio


def _line_of(tree: ModuleTree, predicate) -> int:  # type: ignore[no-untyped-def]
    for line in range(tree.last_line + 1):
        node = tree.get_node_at_line(line)
        if node is not None and predicate(node.data):
            return line
    raise AssertionError("no such row on screen")


async def _click_row(pilot: Pilot[object], tree: ModuleTree, line: int, *, on_mark: bool) -> None:
    node = tree.get_node_at_line(line)
    assert node is not None
    region = tree._get_label_region(line)
    assert region is not None
    icon = (
        cell_len(tree.ICON_NODE_EXPANDED if node.is_expanded else tree.ICON_NODE) if node.allow_expand else 0
    )
    x = region.x + icon + (0 if on_mark else 4) - int(tree.scroll_x)
    y = line - int(tree.scroll_y)
    gutter = tree.content_region.offset - tree.region.offset
    await pilot.click(ModuleTree, offset=(x + gutter.x, y + gutter.y))
    await pilot.pause()


async def test_click_on_the_mark_toggles_a_tensor_and_a_submodule(small_demo: Path) -> None:
    app = make_app(path=str(small_demo), live_meters=False)
    async with app.run_test(size=(120, 36)) as pilot:
        await scanned(pilot)
        await pilot.press("t", "n")
        assert app.selected == set()
        tree = app.main.tensors_pane.module_tree
        line = _line_of(tree, lambda d: isinstance(d, TensorInfo))
        name = tree.get_node_at_line(line).data.name  # type: ignore[union-attr]
        await _click_row(pilot, tree, line, on_mark=True)
        assert app.selected == {name}
        assert tree.cursor_line == line
        await _click_row(pilot, tree, line, on_mark=True)
        assert app.selected == set()

        await _click_row(pilot, tree, line, on_mark=False)  # the name: moves the cursor, selects nothing
        assert app.selected == set()

        line = _line_of(tree, lambda d: isinstance(d, ModuleNode) and d.path == "model.layers")
        node = tree.get_node_at_line(line)
        assert node is not None
        expanded = node.is_expanded
        await _click_row(pilot, tree, line, on_mark=True)
        assert app.selected == set(node.data.names)  # type: ignore[union-attr]
        assert all(n.startswith("model.layers.") for n in app.selected)
        assert node.is_expanded == expanded  # the mark selects; it does not fold or unfold
        await _click_row(pilot, tree, line, on_mark=True)
        assert app.selected == set()
