"""The scan's layout rows read back into module paths (inspector/tui/holders.py); every committed fixture's rows
are read in tests/tui/test_layout_tree.py, these are the wordings no fixture has."""

from __future__ import annotations

from inspector.scan.model import Parallel
from inspector.tui.holders import module_holders, numbers, span


def test_numbers_and_span_are_inverse() -> None:
    assert numbers("0-2, 5") == [0, 1, 2, 5]
    assert numbers("none") == []
    assert span([5, 0, 2, 1]) == "0-2, 5"


def test_experts_placed_apart_and_a_rank_without_experts() -> None:
    """AutoEP can place an expert-parallel rank's experts apart (`experts 0, 2`), and say `ranks none`."""
    par = Parallel(
        "expert",
        ep=2,
        dp=2,
        autoep=True,
        holders=(("m.experts", "experts 0, 2: rank 0 · experts 1, 3: ranks none"),),
    )
    got = module_holders(par)
    assert got["m.experts"] == "experts 0, 2: rank 0 · experts 1, 3: ranks none"
    assert got["m.experts.2"] == "expert 2 · rank 0"
    assert got["m.experts.3"] == "expert 3 · no rank"


def test_a_stage_row_names_its_layers_and_tied_modules() -> None:
    par = Parallel(
        "pipeline",
        pp=2,
        dp=2,
        holders=(
            ("stage 0", "layers 0-1, 3 · tied embed, head · ranks 0, 1"),
            ("stage 1", "layer 4 · tied embed · ranks 2, 3"),
        ),
    )
    got = module_holders(par)
    assert got["3"] == "stage 0 · ranks 0-1"
    assert got["4"] == "stage 1 · ranks 2-3"
    assert got["tied_modules.embed"] == "stages 0-1 · ranks 0-3"
    assert got["tied_modules.head"] == "stage 0 · ranks 0-1"
    assert "2" not in got


def test_nothing_for_data_parallel_or_tensor_parallel() -> None:
    assert module_holders(None) == {}
    assert module_holders(Parallel("tensor", tp=2, dp=4, holders=(("shard 0", "ranks 0, 2"),))) == {}
