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
