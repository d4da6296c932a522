"""The scan's structured placement read into module paths (inspector/tui/holders.py); every committed fixture is
read in tests/tui/test_layout_tree.py, these are the placements no fixture has."""

from __future__ import annotations

from inspector.scan.holding import ExpertSpan, Holding
from inspector.scan.model import Parallel
from inspector.tui.holders import module_holders, span


def test_span_sorts_and_merges() -> None:
    assert span([5, 0, 2, 1, 2]) == "0-2, 5"
    assert span([]) == ""


def test_experts_placed_apart_and_a_rank_without_experts() -> None:
    """AutoEP can place an expert-parallel rank's experts apart (`experts 0, 2`), and record no rank for one."""
    par = Parallel(
        "expert",
        ep=2,
        dp=2,
        autoep=True,
        placement=(Holding("m.experts", (ExpertSpan((0, 2), (0,)), ExpertSpan((1, 3), ()))),),
    )
    got = module_holders(par)
    assert got["m.experts"] == "experts 0, 2: rank 0 · experts 1, 3: rank none"
    assert got["m.experts.2"] == "expert 2 · rank 0"
    assert got["m.experts.3"] == "expert 3 · no rank"
    assert "m.experts.4" not in got


def test_a_stage_row_names_its_layers_and_tied_modules() -> None:
    par = Parallel(
        "pipeline",
        pp=2,
        dp=2,
        placement=(
            Holding(stage=0, layers=(0, 1, 3), tied=("embed", "head"), ranks=(0, 1)),
            Holding(stage=1, layers=(4,), tied=("embed",), ranks=(2, 3)),
        ),
    )
    got = module_holders(par)
    assert got["3"] == "stage 0 · ranks 0-1"
    assert got["4"] == "stage 1 · ranks 2-3"
    assert got["tied_modules.embed"] == "stages 0-1 · ranks 0-3"
    assert got["tied_modules.head"] == "stage 0 · ranks 0-1"
    assert "2" not in got


def test_a_stage_split_in_shards_counts_every_shards_ranks() -> None:
    par = Parallel(
        "pipeline",
        pp=2,
        tp=2,
        placement=(
            Holding(stage=0, shard=0, layers=(0,), ranks=(0,)),
            Holding(stage=0, shard=1, layers=(0,), ranks=(1,)),
            Holding(stage=1, shard=0, layers=(1,), ranks=()),
        ),
    )
    got = module_holders(par)
    assert got["0"] == "stage 0 · ranks 0-1"
    assert got["1"] == "stage 1 · no rank"  # a stage no rank file holds says so, not `rank ` and nothing


def test_nothing_for_data_parallel_or_tensor_parallel() -> None:
    assert module_holders(None) == {}
    assert module_holders(Parallel("tensor", tp=2, dp=4, placement=(Holding(shard=0, ranks=(0, 2)),))) == {}
