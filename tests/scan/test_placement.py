"""`stage_of` on the pipeline layout fixtures (real DeepSpeed 0.19.8 runs): every trainable tensor's stage is
the one the scan's overview lists its layer under (`stage S…: layers A-B, C`; a layer listed on two stages, as a ZeRO-off tied copy, on the first), tied
modules on the first stage."""

from __future__ import annotations

import re

import pytest

from inspector.scan.placement import stage_of
from inspector.scan.scanner import scan
from tests.scan.layout_cases import FIXTURES, ckpt_dir

PIPELINES = sorted(p.parent.name for p in FIXTURES.glob("p*/ckpt"))
ROW = re.compile(r"^stage (\d+)")
LAYERS = re.compile(r"layers? ([\d, -]+)")


def _numbers(text: str) -> set[int]:
    """`0-2`, `0, 4`, `3` -> the layer numbers."""
    out: set[int] = set()
    for part in text.strip(" ,").split(","):
        lo, _, hi = part.strip().partition("-")
        out.update(range(int(lo), int(hi or lo) + 1))
    return out


@pytest.mark.parametrize("layout", PIPELINES)
def test_every_trainable_tensor_is_on_the_stage_the_overview_lists(layout: str) -> None:
    ckpt = scan(str(ckpt_dir(layout)))
    assert ckpt.parallel is not None and ckpt.parallel.pp > 1
    spans: dict[int, set[int]] = {}
    for part, held in ckpt.parallel.holders:
        if (s := ROW.match(part)) and (m := LAYERS.search(held)):
            spans[int(s.group(1))] = _numbers(m.group(1))
    assert sorted(spans) == list(range(ckpt.parallel.pp)), ckpt.parallel.holders
    seen = set()
    for t in ckpt.tensors:
        if t.kind.value != "trainable":
            continue
        layer = t.name.split(".")[0]
        want = 0 if layer == "tied_modules" else min(s for s, r in spans.items() if int(layer) in r)
        assert stage_of(ckpt, t.name) == want, t.name
        seen.add(want)
    assert seen == set(spans)  # every stage holds some tensor: the test reached past stage 0


def test_outside_a_pipeline_there_is_no_stage() -> None:
    ckpt = scan(str(ckpt_dir("tp_z2_bf16_dp2")))
    assert {stage_of(ckpt, t.name) for t in ckpt.tensors} == {None}
