"""Each tensor's recorded `stage` (`TensorInfo.stage`, set by the pipeline layout) on the pipeline layout
fixtures (real DeepSpeed 0.19.8 runs): every trainable tensor's stage is
the first one whose placement (`Parallel.placement`) lists its layer or tied module (a layer listed on two
stages, as a ZeRO-off tied copy, or a tied module on every stage using it: the first), and a tensor read from
a layer file (a buffer) has none, though its layer is placed."""

from __future__ import annotations

import pytest

from inspector.scan.model import Checkpoint, Kind
from inspector.scan.scanner import scan
from tests.scan.layout_cases import FIXTURES, ckpt_dir

PIPELINES = sorted(p.parent.name for p in FIXTURES.glob("p*/ckpt"))


def _placed(ckpt: Checkpoint) -> dict[str, set[int]]:
    """Module path (`4`, `tied_modules.embed`) -> the stages whose placement lists it."""
    assert ckpt.parallel is not None
    out: dict[str, set[int]] = {}
    for h in ckpt.parallel.placement:
        if h.experts:  # pipeline + native MoE: a MoE layer's experts, placed on the stage listing its layer
            continue
        assert h.stage is not None
        for p in h.stage_modules:
            out.setdefault(p, set()).add(h.stage)
    return out


def _module(name: str) -> str:
    head, _, rest = name.partition(".")
    return f"{head}.{rest.split('.')[0]}" if head == "tied_modules" else head


@pytest.mark.parametrize("layout", PIPELINES)
def test_every_trainable_tensor_is_on_the_first_stage_placing_it(layout: str) -> None:
    ckpt = scan(str(ckpt_dir(layout)))
    assert ckpt.parallel is not None and ckpt.parallel.pp > 1
    placed = _placed(ckpt)
    assert {s for stages in placed.values() for s in stages} == set(range(ckpt.parallel.pp))
    seen = set()
    for t in ckpt.tensors:
        if t.kind is not Kind.TRAINABLE:
            continue
        want = min(placed[_module(t.name)])
        assert ckpt.tensor(t.name).stage == want, t.name
        seen.add(want)
    assert seen == set(
        range(ckpt.parallel.pp)
    )  # every stage holds some tensor: the test reached past stage 0


def test_a_buffer_has_no_stage_though_its_layer_is_placed() -> None:
    """Layer 2's `scale` buffer is read from its layer file, which names no stage: the stage recorded says where the
    bytes are read, not which stage's module holds the layer (that is the placement's: stage 0)."""
    ckpt = scan(str(ckpt_dir("pp_z1_bf16_dp2")))
    assert ckpt.tensor("2.scale").kind is Kind.BUFFER
    assert _placed(ckpt)["2"] == {0}
    assert ckpt.tensor("2.scale").stage is None
    assert ckpt.tensor("2.norm.weight").stage == 0


def test_outside_a_pipeline_there_is_no_stage() -> None:
    ckpt = scan(str(ckpt_dir("tp_z2_bf16_dp2")))
    assert {ckpt.tensor(t.name).stage for t in ckpt.tensors} == {None}
