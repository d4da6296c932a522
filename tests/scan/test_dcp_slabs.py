"""Row slabs laid at once (`placement.slabs`) are laid as `runs` lays them chunk by chunk: the same segments
whenever `slabs` answers, and no answer (so `runs` decides, and says why) for anything that is not row slabs
tiling the first dimension: gaps, overlaps, chunks past the edge, 2-D blocks, empty tensors."""

from __future__ import annotations

import math
import random
from itertools import pairwise

import numpy as np
import pytest

from inspector.scan.layouts.dcp.placement import Chunk, TilingError, runs, slabs


def _case(rng: random.Random) -> tuple[tuple[int, ...], list[Chunk]]:
    """A tensor and chunks of it: row slabs cut at random (some empty, shuffled), then now and then spoilt."""
    shape = tuple(rng.randint(0 if rng.random() < 0.05 else 1, 6) for _ in range(rng.randint(1, 3)))
    cuts = sorted(rng.choices(range(shape[0] + 1), k=rng.randint(0, 4)))
    bounds = [0, *cuts, shape[0]]
    rest = shape[1:]
    inner, packed = math.prod(rest), rng.random() < 0.3  # packed: one file, each slab right after the last
    chunks = [
        Chunk(
            (a, *(0,) * len(rest)),
            (b - a, *rest),
            "/f0" if packed else f"/f{rng.randint(0, 2)}",
            64 + 4 * a * inner if packed else rng.randrange(0, 10_000, 4),
        )
        for a, b in pairwise(bounds)
    ]
    spoil = rng.random()
    if spoil < 0.1 and chunks:  # a gap or an overlap
        c = chunks[rng.randrange(len(chunks))]
        chunks[chunks.index(c)] = Chunk(
            (c.offsets[0] + rng.choice((-1, 1)), *c.offsets[1:]), c.sizes, c.file, c.offset
        )
    elif spoil < 0.2 and chunks:  # past the edge
        c = chunks[-1]
        chunks[-1] = Chunk(c.offsets, (c.sizes[0] + 1, *c.sizes[1:]), c.file, c.offset)
    elif spoil < 0.3 and len(shape) == 2 and shape[1] > 1:  # 2-D blocks: split along the columns too
        half = shape[1] // 2
        chunks = [
            Chunk((c.offsets[0], o), (c.sizes[0], n), c.file, c.offset + 1000 * o)
            for c in chunks
            for o, n in ((0, half), (half, shape[1] - half))
        ]
    elif spoil < 0.35 and chunks:  # a chunk dropped
        chunks.pop(rng.randrange(len(chunks)))
    rng.shuffle(chunks)
    return shape, chunks


@pytest.mark.parametrize("seed", range(4))
def test_slabs_lay_what_runs_lays_or_leave_it_to_runs(seed: int) -> None:
    rng, answered, declined = random.Random(seed), 0, 0
    for _ in range(500):
        shape, chunks = _case(rng)
        nd = len(shape)
        dims = np.array([[*c.offsets, *c.sizes] for c in chunks], dtype=np.int64).reshape(len(chunks), 2 * nd)
        fast = slabs(shape, "float32", dims, [c.file for c in chunks], [c.offset for c in chunks])
        try:
            slow = list(runs(shape, "float32", chunks))
        except TilingError:
            slow = None
        if fast is None:
            declined += 1
        else:
            answered += 1
            assert fast == slow, (shape, chunks)
    assert answered > 100 and declined > 100  # both ways are exercised
