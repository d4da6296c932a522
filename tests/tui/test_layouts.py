"""The app on model-parallel checkpoints saved by real DeepSpeed (tests/fixtures/layouts): the overview says
the layout and the tensor tree shows the model's own modules (pipeline layers, tied modules, experts)."""

from __future__ import annotations

import pytest

from inspector.tui.app import make_app
from tests.scan.layout_cases import ckpt_dir
from tests.tui.conftest import plain, scanned


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
