"""`f` (#28 item 17): a flat tensor table beside the tree, sortable by size, dtype, rank count and name, sharing
the tree's filter and selection."""

from __future__ import annotations

from pathlib import Path

import pytest

from inspector.tui.app import make_app
from inspector.tui.widgets.tensor_table import TensorTable
from tests.tui.conftest import scanned

pytestmark = pytest.mark.asyncio


def _names(table: TensorTable) -> list[str]:
    return [str(table.coordinate_to_cell_key((r, 0)).row_key.value) for r in range(table.row_count)]


async def test_flat_table_sorts_and_selects(small_demo: Path) -> None:
    app = make_app(path=str(small_demo), live_meters=False)
    async with app.run_test(size=(120, 36)) as pilot:
        await scanned(pilot)
        await pilot.press("t", "f")
        pane = app.main.tensors_pane
        table = pane.flat
        assert app.focused is table and table.row_count == len(app.ckpt.tensors)
        tree = pane.module_tree
        out = {t.name: tree.out_bytes(t) for t in app.ckpt.tensors}
        by_size = _names(table)
        assert [out[n] for n in by_size] == sorted(out.values(), reverse=True)  # size first, largest on top
        await pilot.press("S")  # dtype
        dtypes = [app.ckpt.tensor(n).dtype for n in _names(table)]
        assert dtypes == sorted(dtypes)
        await pilot.press("S")  # rank count
        ranks = [len(tree.ranks_of(n)) for n in _names(table)]
        assert ranks == sorted(ranks, reverse=True)
        await pilot.press("S")  # name
        assert _names(table) == sorted(out)
        await pilot.press("g", "space")
        first = _names(table)[0]
        assert first not in app.selected  # the tree's selection, toggled from the table
        assert first not in tree.selected
        await pilot.press("slash", *"q_proj", "enter")
        assert _names(table) and all("q_proj" in n for n in _names(table))
        assert app.focused is table
        await pilot.press("f")
        assert app.focused is tree


async def test_elide_middle_keeps_both_ends() -> None:
    from inspector.tui.fmt import elide_middle

    name = "model.layers.0.mlp.down_proj.weight"
    assert elide_middle(name, 100) == name
    short = elide_middle(name, 32)
    assert len(short) == 32 and short.startswith("model.layers") and short.endswith("down_proj.weight")
    assert "…" in short


@pytest.mark.parametrize("size", [(80, 24), (120, 36), (160, 48)])
async def test_names_first_fitted_and_never_cut_at_the_end(small_demo: Path, size: tuple[int, int]) -> None:
    app = make_app(path=str(small_demo), live_meters=False)
    async with app.run_test(size=size) as pilot:
        await scanned(pilot)
        await pilot.press("t", "f")
        await pilot.pause()
        table = app.main.tensors_pane.flat
        assert [str(c.key.value) for c in table.ordered_columns][:3] == ["mark", "name", "size"]
        width = table.ordered_columns[1].width
        cells = {}
        for r, name in enumerate(_names(table)):
            cell = cells[name] = table.get_cell_at((r, 1)).plain
            # fitted: leading module names shrink first (m.l.0.mlp.down_proj.weight), the end stays
            assert len(cell) <= width and cell.split(".")[-1] == name.split(".")[-1], (cell, name)
        assert len(set(cells.values())) == len(cells)  # no two rows read the same (gate, up or down?)
        # every column, the size among them, lies inside the pane: nothing to scroll sideways to see it
        assert sum(c.get_render_width(table) for c in table.ordered_columns) <= table.size.width


async def test_a_second_click_on_a_header_reverses(small_demo: Path) -> None:
    app = make_app(path=str(small_demo), live_meters=False)
    async with app.run_test(size=(120, 36)) as pilot:
        await scanned(pilot)
        await pilot.press("t", "f")
        table = app.main.tensors_pane.flat
        from textual.widgets import DataTable

        def click(key: str) -> None:
            column = next(c for c in table.ordered_columns if c.key.value == key)
            table.post_message(
                DataTable.HeaderSelected(table, column.key, table.ordered_columns.index(column), column.label)
            )

        click("name")
        await pilot.pause()
        assert _names(table) == sorted(_names(table)) and not table.reverse
        click("name")
        await pilot.pause()
        assert _names(table) == sorted(_names(table), reverse=True) and table.reverse
        await pilot.press("S")  # the next order, from its own start
        assert table.order_by == "size" and not table.reverse
