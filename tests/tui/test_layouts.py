"""The app on model-parallel checkpoints saved by real DeepSpeed (tests/fixtures/layouts): the overview says
the layout and the tensor tree shows the model's own modules (pipeline layers, tied modules, experts); the
export form converts AutoTP under ZeRO-3 through the same plan as `convert`."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from safetensors.numpy import load_file

from inspector.tui.app import make_app
from tests.scan.layout_cases import ckpt_dir, expected
from tests.tui.conftest import exported_fp32, plain, scanned


@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("name", "layout", "tensors"),
    [
        (
            "pp_z1_bf16_dp2",
            "pipeline parallel: 2 stages",
            ["tied_modules.embed.weight", "2.norm.weight", "2.scale"],
        ),
        (
            "moe_z2_bf16_ws4",
            "expert parallel: EP 2",
            [f"moe.deepspeed_moe.experts.deepspeed_experts.{e}" for e in range(4)]
            + ["moe.deepspeed_moe.gate.wg"],
        ),
        (
            "tp_z2_bf16_dp2",
            "tensor parallel: 2 shards",
            ["model.layers.0.mlp.down_proj.weight", "lm_head.weight"],
        ),
        (
            "tp_z3_bf16_dp2",
            "tensor parallel: 2 shards × 2 data-parallel ranks",
            ["model.layers.0.mlp.down_proj.weight", "lm_head.weight"],
        ),
    ],
)
async def test_the_app_shows_the_layout_and_its_tree(name: str, layout: str, tensors: list[str]) -> None:
    app = make_app(path=str(ckpt_dir(name)), live_meters=False)
    async with app.run_test(size=(140, 44)) as pilot:
        await scanned(pilot)
        assert app.ckpt is not None and app.ckpt.parallel is not None
        assert layout in " ".join(plain(w) for w in app.main.query("*"))
        await pilot.press("t")
        tree = app.main.tensors_pane.module_tree
        for t in tensors:
            assert tree.reveal(t), t


def test_the_tensor_detail_counts_the_ways_a_layout_split_a_group() -> None:
    """A stage's or an expert-parallel rank's group is split over its own data-parallel ranks, not the world;
    a tensor-parallel tensor says it was joined from shards."""
    from inspector.scan.scanner import scan
    from inspector.tui.widgets.tensor_detail import padding_note

    moe = scan(str(ckpt_dir("moe_z2_bf16_ws4")))
    assert "split 2 ways" in padding_note(
        moe, moe.tensor("moe.deepspeed_moe.experts.deepspeed_experts.3.0.weight")
    )
    tp = scan(str(ckpt_dir("tp_z2_bf16_dp2")))
    assert padding_note(tp, tp.tensor("lm_head.weight")).startswith("Joined from 2 tensor-parallel shards")


@pytest.mark.asyncio
async def test_the_app_exports_autotp_under_zero3_bit_exact(tmp_path: Path) -> None:
    """The export form on AutoTP under ZeRO-3 (TP 2 x DP 2) runs the same plan as `convert`: the joined
    fp32 masters equal ds_to_universal's merge of the same checkpoint, bit for bit."""
    out = tmp_path / "out"
    app = make_app(path=str(ckpt_dir("tp_z3_bf16_dp2")), out_dir=str(out), live_meters=False)
    async with app.run_test(size=(120, 36)) as pilot:
        await scanned(pilot)
        assert app.ckpt is not None and not app.ckpt.errors and app.ckpt.stage == 3
        assert await exported_fp32(pilot) == "done"
    written: dict[str, Any] = {}
    for name in os.listdir(out):
        if name.endswith(".safetensors"):
            written.update(load_file(str(out / name)))
    masters = {k[5:]: v for k, v in expected("tp_z3_bf16_dp2").items() if k.startswith("fp32/")}
    assert masters and set(masters) == set(written)
    for name, want in masters.items():
        assert np.array_equal(written[name].view(np.uint32), want.view(np.uint32)), name
