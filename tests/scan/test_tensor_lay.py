"""`lay`: a tensor from its shards' byte ranges by a `Layout`, checked element by element against numpy on
small cases (split on dim 0 and 1, fused sub-parameters, 2-D blocks, shards split across files mid-row),
and kept compact where rows are many: a row-parallel join of 1,048,576 one-element rows per shard is one
record, not two million segments (issue 38)."""

from __future__ import annotations

import itertools
import pickle

import numpy as np
import pytest

from inspector.parse.affine import Block, Layout, split, sub_params
from inspector.scan.model import Runs, Segment
from inspector.scan.tensor_lay import lay

Segs = tuple[Segment, ...]


def _shard(rank: int, numel: int, cuts: tuple[int, ...] = ()) -> Segs:
    """Shard `rank`'s elements as fp32 segments of file `s<rank>`, cut into files at `cuts` (a ZeRO
    partition boundary): element i of the shard sits at byte 4*i of its file, whichever file."""
    edges = [0, *cuts, numel]
    return tuple(
        Segment(f"s{rank}.{k}", 4 * a, b - a, "float32") for k, (a, b) in enumerate(itertools.pairwise(edges))
    )


def _decode(segs: Segs) -> list[int]:
    """shard * 10**6 + element, for every element the segments stand for, in order."""
    return [
        int(s.file[1 : s.file.index(".")]) * 10**6 + s.offset // 4 + i for s in segs for i in range(s.numel)
    ]


def _want(layout: Layout) -> list[int]:
    """The same from numpy: each shard's element ids laid into the full tensor by the blocks."""
    full = np.full(layout.logical, -1, dtype=np.int64)
    for b in layout.blocks:
        shape = layout.shards[b.rank]
        shard = (b.rank * 10**6 + np.arange(int(np.prod(shape)))).reshape(shape)
        src = tuple(slice(a, a + n) for a, n in zip(b.at, b.shape, strict=True))
        dst = tuple(slice(a, a + n) for a, n in zip(b.start, b.shape, strict=True))
        full[dst] = shard[src]
    assert (full >= 0).all()
    return [int(x) for x in full.reshape(-1)]


def _check(layout: Layout, cuts: dict[int, tuple[int, ...]] | None = None) -> Segs:
    parts = [_shard(t, int(np.prod(s)), (cuts or {}).get(t, ())) for t, s in enumerate(layout.shards)]
    got = lay(layout, parts, "w")
    assert _decode(got) == _want(layout)
    return got


@pytest.mark.parametrize("cuts", [{}, {0: (7,), 1: (1, 20)}])
def test_splits_and_sub_parameters_lay_every_element_where_numpy_does(
    cuts: dict[int, tuple[int, ...]],
) -> None:
    _check(split([(4, 6), (3, 6)], 0, "t"), cuts)
    _check(split([(6, 4), (6, 3)], 1, "t"), cuts)
    _check(split([(2, 3, 4), (2, 3, 5)], 2, "t"), cuts)
    _check(sub_params([(5, 4), (7, 4)], 0, ((2, 4), (3, 3)), "t"), cuts)
    _check(sub_params([(3, 5), (3, 7)], 1, ((2, 4), (3, 3)), "t"), cuts)


def test_two_dimensional_blocks() -> None:
    """TP x FSDP-like 2-D blocks: 4 shards each a (2, 3) block of a (4, 6) tensor, and a 3-D tensor whose
    blocks cut its first two dims."""
    blocks = tuple(Block((r, c), (2, 3), 2 * (r // 2) + c // 3, (0, 0)) for r in (0, 2) for c in (0, 3))
    _check(Layout((4, 6), ((2, 3),) * 4, blocks, "t"), {1: (4,)})
    blocks3 = tuple(Block((e, r, 0), (1, 2, 3), 2 * e + r // 2, (0, 0, 0)) for e in (0, 1) for r in (0, 2))
    _check(Layout((2, 4, 3), ((1, 2, 3),) * 4, blocks3, "t"))


@pytest.mark.slow  # a million rows per shard: tox -e slow
def test_a_million_rows_per_shard_join_as_one_record() -> None:
    """The attack of issue 38: 1,048,576 x 1 per shard, joined on dim 1. One `Strided` record stands for the
    2,097,152 segments, read back as the tuple would be; a shard cut across two files mid-way adds records
    only at the cut."""
    rows = 1 << 20
    layout = split([(rows, 1), (rows, 1)], 1, "t")
    parts = [_shard(0, rows), _shard(1, rows)]
    got = lay(layout, parts, "w")
    assert isinstance(got, Runs) and len(got.blocks) == 1 and len(got) == 2 * rows
    assert got[0] == Segment("s0.0", 0, 1, "float32") and got[1] == Segment("s1.0", 0, 1, "float32")
    assert got[-1] == Segment("s1.0", 4 * (rows - 1), 1, "float32")
    assert got[2 * 1000 + 1] == Segment("s1.0", 4000, 1, "float32")
    assert sum(s.numel for s in got) == 2 * rows
    assert pickle.loads(pickle.dumps(got)) == got
    cut = lay(layout, [_shard(0, rows, (rows // 2 + 1,)), parts[1]], "w")
    assert isinstance(cut, Runs) and len(cut.blocks) == 2 and len(cut) == 2 * rows
    assert cut[2 * (rows // 2 + 1)] == Segment("s0.1", 4 * (rows // 2 + 1), 1, "float32")


def test_small_results_stay_plain_tuples_with_adjacent_ranges_merged() -> None:
    got = lay(split([(4, 6), (3, 6)], 0, "t"), [_shard(0, 24), _shard(1, 18)], "w")
    assert got == (Segment("s0.0", 0, 24, "float32"), Segment("s1.0", 0, 18, "float32"))


def test_blocks_cut_over_too_many_outer_indices_are_refused_not_walked() -> None:
    """2-D blocks under 70,000 outer indices: the walk would be one step per index, so it is refused with
    the parameter's name (a bound on the work, whatever the record says)."""
    from inspector.errors import InspectorError

    n = 70_000
    blocks = tuple(Block((0, r, c), (n, 1, 1), 2 * r + c, (0, 0, 0)) for r in (0, 1) for c in (0, 1))
    layout = Layout((n, 2, 2), ((n, 1, 1),) * 4, blocks, "t")
    with pytest.raises(InspectorError, match="w: its tensor-parallel layout cannot be read"):
        lay(layout, [_shard(t, n) for t in range(4)], "w")
