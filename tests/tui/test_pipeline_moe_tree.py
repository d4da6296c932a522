"""The app on pipeline + native MoE (tests/fixtures/layouts/ppmoe_z1_bf16, 2 stages x DP 2, EP 2 per
stage): the overview says the layout, every top-level layer its stage, every expert its global index and the
global ranks (stage x 2 + data-parallel rank) holding it, and every tensor row only ranks of its stage."""

from __future__ import annotations

from pathlib import Path

import pytest

from inspector.tui.app import make_app
from tests.tui.conftest import plain, scanned
from tests.tui.test_layout_tree import _holder_ranks, _marked_ranks, _rows

pytestmark = pytest.mark.asyncio

CKPT = Path(__file__).resolve().parents[1] / "fixtures" / "layouts" / "ppmoe_z1_bf16" / "ckpt"


async def test_the_tree_shows_stages_and_experts() -> None:
    app = make_app(path=str(CKPT), live_meters=False)
    async with app.run_test(size=(120, 40)) as pilot:
        await scanned(pilot)
        assert app.ckpt is not None, app.refused
        overview = " ".join(plain(w) for w in app.main.query("*"))
        await pilot.press("t")
        rows = _rows(app.main.tensors_pane.module_tree.root)
        await pilot.pause()
    ckpt = app.ckpt
    assert "pipeline parallel with native MoE: 2 stages × EP 2 × expert-DP 1 (4 ranks)" in overview
    stage_ranks = {0: {0, 1}, 1: {2, 3}}
    for layer, stage in (("0", 0), ("1", 0), ("2", 1), ("3", 1)):
        assert f"  stage {stage}" in rows[layer], rows[layer]
        assert _holder_ranks(rows[layer]) == stage_ranks[stage], rows[layer]
    for t in ckpt.tensors:
        assert t.stage is not None and _marked_ranks(rows[t.name]) <= stage_ranks[t.stage], (t.name, rows[t.name])
    for layer, stage in (("1", 0), ("2", 1)):
        for e in range(4):
            row = rows[f"{layer}.moe.deepspeed_moe.experts.deepspeed_experts.{e}"]
            held = stage * 2 + e // 2  # experts 0-1 on the stage's first rank, 2-3 on its second
            assert f"expert {e} · rank {held}" in row, row
