"""The Health table's name column at 80x24 (issue 42 polish): names that shrink alike keep the parts that tell
them apart (a LoRA layer's lora_A and lora_B rows looked the same), while streaming and after the sort."""

from __future__ import annotations

from pathlib import Path

import pytest

from inspector.tui.app import make_app
from inspector.tui.widgets.health_view import HealthTable
from inspector.tui.widgets.short_names import elide, elide_all
from tests.tui.conftest import scanned, wait_for

LORA = Path(__file__).parents[1] / "fixtures" / "trainer_lora" / "run"
A = "base_model.model.model.layers.0.self_attn.q_proj.lora_A.default.weight"
B = A.replace("lora_A", "lora_B")


def test_names_that_shrink_alike_keep_what_differs() -> None:
    assert elide(A, 24) == elide(B, 24)  # alone, each shrinks to the same text
    fitted = elide_all([A, B, "model.layers.12.self_attn.o_proj.weight"], 24)
    assert fitted[A] != fitted[B] and "lora_A" in fitted[A] and "lora_B" in fitted[B]
    assert all(len(v) <= 24 for v in fitted.values())
    assert ".0." in fitted[A]  # the layer number stays too
    assert fitted["model.layers.12.self_attn.o_proj.weight"] == "m.l.12.s.o_proj.weight"  # others as before


def _cells(table: HealthTable) -> dict[str, set[str]]:
    """Full name -> the texts its rows show in the name column."""
    out: dict[str, set[str]] = {}
    for row in range(table.row_count):
        key = table.coordinate_to_cell_key((row, 0)).row_key.value  # type: ignore[arg-type]
        assert key is not None
        name = table.entries[int(key)].row.name
        out.setdefault(name, set()).add(str(table.get_cell_at((row, 0))))
    return out


@pytest.mark.asyncio
async def test_lora_rows_read_apart_at_80x24() -> None:
    app = make_app(path=str(LORA), live_meters=False)
    async with app.run_test(size=(80, 24)) as pilot:
        await scanned(pilot)
        await pilot.press("h")
        pane = app.main.health_pane
        await wait_for(pilot, lambda: pane.report is not None and not pane.running, "the health pass")
        table = pane.table
        cells = _cells(table)
        lora = {n: c for n, c in cells.items() if ".lora_" in n}
        assert len(lora) >= 12
        shown = [next(iter(c)) for c in lora.values()]
        assert all(len(c) == 1 for c in lora.values())  # every stream of a tensor reads the same
        assert len(set(shown)) == len(shown), sorted(shown)  # and no two tensors read alike
        assert all(len(s) <= table._name_width for s in shown)


def test_the_change_heading_elides_the_tag_in_its_middle() -> None:
    from inspector.tui.widgets.short_names import since_heading

    assert since_heading("global_step3", 40) == "change since global_step3"
    assert since_heading("global_step1200", 23) == "Δ since global_step1200"
    cut = since_heading("checkpoint-global_step1200", 20)
    assert len(cut) <= 20 and cut.startswith("Δ since ") and cut.endswith("1200"), cut  # its end stays


def test_the_row_detail_says_what_m_and_v_are() -> None:
    """The src column's `m` and `v` are spelled out in the highlighted row's detail."""
    from inspector.health import run_check
    from inspector.scan.scanner import scan
    from inspector.tui.widgets.health_view import Entry, row_detail

    rows = run_check(scan(str(LORA))).rows
    said = {r.source: row_detail(Entry(r, 0)).plain.splitlines()[0] for r in rows}
    assert "  m (Adam exp_avg) · " in said["exp_avg"]
    assert "  v (Adam exp_avg_sq) · " in said["exp_avg_sq"]
