"""Who holds what, as the scan records it (`Parallel.placement`, inspector/scan/holding.py), on every layout fixture
saved by real DeepSpeed 0.19.8, and its one wording.

The structure is checked against the checkpoint itself (every expert, layer and tied module a tensor names is
placed; stages and shards on disjoint ranks that make up the world) and, for a few fixtures, against the
topology DeepSpeed documents. The words are pinned byte for byte on every fixture by holders_golden.json, which
is `scan --json`'s `holders` as the scan printed them before they were rendered from the structure."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from inspector.scan.holding import ExpertSpan, Holding, expert_spans, holder_row
from inspector.scan.model import Checkpoint, Kind
from tests.scan.layout_cases import MODEL_PARALLEL as LAYOUTS
from tests.scan.layout_cases import scan_layout

GOLDEN = json.loads((Path(__file__).parent / "holders_golden.json").read_text())


def test_every_fixture_is_pinned() -> None:
    assert sorted(GOLDEN) == LAYOUTS


@pytest.mark.parametrize("layout", LAYOUTS)
def test_the_words_are_the_public_ones(layout: str) -> None:
    par = scan_layout(layout).parallel
    assert par is not None
    assert [list(row) for row in par.holders] == GOLDEN[layout]


def _experts_check(ckpt: Checkpoint) -> None:
    """Each MoE layer's spans share out its experts (each once) and its ranks (each rank holds one span)."""
    par = ckpt.parallel
    assert par is not None and par.placement
    for h in par.placement:
        assert h.module and h.stage is None and h.shard is None and not h.layers and not h.ranks
        experts = [e for s in h.experts for e in s.experts]
        assert sorted(experts) == list(range(len(experts))), h
        ranks = [r for s in h.experts for r in s.ranks]
        assert sorted(ranks) == list(range(ckpt.world_size)), h
        under = [t for t in ckpt.tensors if t.name.startswith(h.module + ".") and t.kind is Kind.TRAINABLE]
        named = {int(t.name[len(h.module) + 1 :].split(".")[0]) for t in under if not par.autoep}
        if par.autoep:  # AutoEP fuses a layer's experts: dim 0 of each fused weight is the global expert
            assert under and {t.shape[0] for t in under} == {len(experts)}, h
        else:
            assert named == set(experts), h


def _stages_check(ckpt: Checkpoint) -> None:
    """Every stage (and shard) listed once, on disjoint ranks making up the world; every trainable tensor's
    layer or tied module placed on a stage (tests/scan/test_placement.py: `stage_of` agrees)."""
    par = ckpt.parallel
    assert par is not None
    keys = sorted((h.stage, h.shard or 0) for h in par.placement)
    assert keys == [(s, t) for s in range(par.pp) for t in range(par.tp)]
    ranks = sorted(r for h in par.placement for r in h.ranks)
    assert ranks == list(range(ckpt.world_size))
    stages: dict[str, set[int]] = {}
    for h in par.placement:
        assert h.stage is not None and not h.experts and not h.module
        for p in h.stage_modules:
            stages.setdefault(p, set()).add(h.stage)
    seen = set()
    for t in ckpt.tensors:
        if t.kind is Kind.TRAINABLE:
            head = t.name.split(".")[0]
            path = ".".join(t.name.split(".")[:2]) if head == "tied_modules" else head
            assert path in stages, t.name
            seen |= stages[path]
    assert seen == set(range(par.pp))  # every stage holds a master: the check reached past stage 0


def _pipeline_check(ckpt: Checkpoint) -> None:
    """A pipeline's stage rows (`_stages_check`); with native MoE (`pipemoe`) also one row per MoE layer, whose
    experts are shared out (each once) over exactly the ranks of the stage that places that layer."""
    par = ckpt.parallel
    assert par is not None
    stages = [h for h in par.placement if not h.experts]
    experts = [h for h in par.placement if h.experts]
    assert bool(experts) == (par.ep > 1)
    _stages_check(replace(ckpt, parallel=replace(par, placement=tuple(stages))))
    for h in experts:
        assert h.module and h.stage is None and h.shard is None and not h.layers and not h.ranks
        layer = int(h.module.split(".")[0])
        (stage,) = [s for s in stages if layer in s.layers]
        held = [e for s in h.experts for e in s.experts]
        assert sorted(held) == list(range(len(held))), h
        assert sorted(r for s in h.experts for r in s.ranks) == list(stage.ranks), h
        named = {
            int(t.name[len(h.module) + 1 :].split(".")[0])
            for t in ckpt.tensors
            if t.name.startswith(h.module + ".") and t.kind is Kind.TRAINABLE
        }
        assert named == set(held), h


def _shards_check(ckpt: Checkpoint) -> None:
    """Tensor-parallel shard t is the ranks r with r mod tp = t (the topology's numbering), every rank once."""
    par = ckpt.parallel
    assert par is not None
    assert [h.shard for h in par.placement] == list(range(par.tp))
    for h in par.placement:
        assert h.stage is None and not h.experts and not h.layers and not h.tied
        assert h.ranks == tuple(range(h.shard or 0, ckpt.world_size, par.tp))


@pytest.mark.parametrize("layout", LAYOUTS)
def test_the_placement_accounts_for_the_checkpoint(layout: str) -> None:
    ckpt = scan_layout(layout)
    assert ckpt.parallel is not None
    {"expert": _experts_check, "pipeline": _pipeline_check, "tensor": _shards_check}[ckpt.parallel.kind](ckpt)


@pytest.mark.parametrize(
    ("layout", "want"),
    [
        # DeepSpeed's MoE: rank R is expert-parallel rank R mod ep; ep 2 over 4 ranks, 2 local experts each;
        # the second MoE layer has ep_size 1: all four ranks hold both its experts
        (
            "moe_z2_bf16_ws4",
            (
                Holding(
                    "moe.deepspeed_moe.experts.deepspeed_experts",
                    expert_spans({0: [0, 2], 1: [0, 2], 2: [1, 3], 3: [1, 3]}),
                ),
                Holding("moe2.deepspeed_moe.experts.deepspeed_experts", (ExpertSpan((0, 1), (0, 1, 2, 3)),)),
            ),
        ),
        # AutoEP records each rank's expert-parallel rank and which global experts it places there
        (
            "autoep_z3_bf16_ws4",
            (
                Holding(
                    "model.layers.0.mlp.experts", (ExpertSpan((0, 1), (0, 2)), ExpertSpan((2, 3), (1, 3)))
                ),
            ),
        ),
        # PipeDataParallelTopology: stage s is ranks s*dp .. s*dp+dp-1; layer 3 is a function, 5 the tied head
        (
            "pp_z1_bf16_dp2",
            (
                Holding(stage=0, layers=(1, 2), tied=("embed",), ranks=(0, 1)),
                Holding(stage=1, layers=(4,), tied=("embed",), ranks=(2, 3)),
            ),
        ),
        # pipeline x tensor: stage s, shard t is rank 2s + t
        (
            "pptp_z1_bf16",
            (
                Holding(stage=0, shard=0, layers=(0, 1), ranks=(0,)),
                Holding(stage=0, shard=1, layers=(0, 1), ranks=(1,)),
                Holding(stage=1, shard=0, layers=(3, 4, 5), ranks=(2,)),
                Holding(stage=1, shard=1, layers=(3, 4, 5), ranks=(3,)),
            ),
        ),
    ],
)
def test_the_placement_is_the_topologys(layout: str, want: tuple[Holding, ...]) -> None:
    par = scan_layout(layout).parallel
    assert par is not None and par.placement == want


@pytest.mark.parametrize(
    ("h", "autoep", "want"),
    [
        (
            Holding(stage=1, layers=(3, 4, 5, 7), tied=("embed", "head"), ranks=(1, 3)),
            False,
            ("stage 1", "layers 3-5, 7 · tied embed, head · ranks 1, 3"),
        ),
        (Holding(stage=0, layers=(2,), ranks=(0,)), False, ("stage 0", "layer 2 · ranks 0")),
        (Holding(stage=0, ranks=()), False, ("stage 0", "no parameter layers · ranks –")),
        (
            Holding(stage=1, shard=1, layers=(3,), ranks=(3,)),
            False,
            ("stage 1 · shard 1", "layer 3 · ranks 3"),
        ),
        (Holding(shard=0, ranks=(0, 2)), False, ("shard 0", "ranks 0, 2")),
        (
            Holding(shard=0, ranks=(0,)),
            False,
            ("shard 0", "ranks 0"),
        ),  # a shard's and a stage's rows: always `ranks`
        # a lone expert: AutoEP's rows say `expert`, native MoE's have always said `experts`
        (Holding("m", (ExpertSpan((3,), (1,)),)), False, ("m", "experts 3: rank 1")),
        (Holding("m", (ExpertSpan((3,), (1,)),)), True, ("m", "expert 3: rank 1")),
        (
            Holding("m", (ExpertSpan((0, 2), (0, 1)), ExpertSpan((1, 3), ()))),
            True,
            ("m", "experts 0, 2: ranks 0, 1 · experts 1, 3: rank none"),
        ),
    ],
)
def test_one_wording(h: Holding, autoep: bool, want: tuple[str, str]) -> None:
    assert holder_row(h, autoep=autoep) == want


def test_native_experts_group_by_the_ranks_that_hold_them() -> None:
    assert expert_spans({2: [1], 0: [0], 1: [0], 3: [1]}) == (
        ExpertSpan((0, 1), (0,)),
        ExpertSpan((2, 3), (1,)),
    )


def test_a_stage_row_names_its_modules_as_the_pipeline_module_does() -> None:
    h = Holding(stage=0, layers=(1, 2), tied=("embed",), ranks=(0,))
    assert h.stage_modules == ("1", "2", "tied_modules.embed")


@pytest.mark.parametrize("layout", LAYOUTS)
def test_scan_json_carries_the_placement_as_data(layout: str) -> None:
    """`scan --json`'s `placement` is the structure the words are rendered from, row for row: each row's
    words rebuilt from its JSON are the `holders` row beside it (plain types only: it went through json)."""
    from inspector.scan.json_view import checkpoint_json

    ckpt = scan_layout(layout)
    par = json.loads(json.dumps(checkpoint_json(ckpt)))["parallel"]
    assert len(par["placement"]) == len(par["holders"]) == len(GOLDEN[layout])
    for row, words in zip(par["placement"], par["holders"], strict=True):
        h = Holding(
            module=row["module"] or "",
            experts=tuple(ExpertSpan(tuple(e["experts"]), tuple(e["ranks"])) for e in row["experts"]),
            stage=row["stage"],
            shard=row["shard"],
            layers=tuple(row["layers"]),
            tied=tuple(row["tied"]),
            ranks=tuple(row["ranks"]),
        )
        assert ckpt.parallel is not None
        assert list(holder_row(h, autoep=ckpt.parallel.autoep)) == [words["part"], words["holders"]]


WORDS = {  # the topology each maker script launched (tests/fixtures/layouts/make_*.py)
    "pp_z1_bf16_dp2": "pipeline parallel: 2 stages × 2 data-parallel ranks",
    "pptp_z1_bf16": "pipeline parallel: 2 stages × 2 tensor-parallel shards × 1 data-parallel rank",
    "tp_z2_bf16_dp2": "tensor parallel: 2 shards × 2 data-parallel ranks",
    "moe_z2_bf16_ws4": "expert parallel: EP 2 × expert-DP 2 (4 ranks)",
    "autoep_z3_bf16_ws4": "expert parallel: EP 2 × expert-DP 2 (4 ranks)",
}


@pytest.mark.parametrize("layout", sorted(WORDS))
def test_scan_json_says_the_layout_in_the_overviews_words(layout: str) -> None:
    """`scan --json`'s `parallel.words` is the overview's Layout row, as the layout wrote it at scan."""
    from inspector.scan.json_view import checkpoint_json
    from inspector.scan.summary import summary_rows

    ckpt = scan_layout(layout)
    par = json.loads(json.dumps(checkpoint_json(ckpt)))["parallel"]
    overview = next(r.value for r in summary_rows(ckpt) if r.key == "parallel")
    assert par["words"] == overview == WORDS[layout]


def test_scan_json_of_a_data_parallel_checkpoint_has_no_layout_words() -> None:
    from inspector.scan.json_view import checkpoint_json

    assert checkpoint_json(scan_layout("sp2_z1_bf16"))["parallel"] is None
