"""A tensor rebuilt from its shards' byte ranges by a `Layout` (FORMAT.md §4.2), whatever record the layout
came from: blocks along dim 0 are whole ranges of a shard; blocks cut along a later dim give every row a
piece of several shards, kept as `Strided` records (one per run of rows that share their pieces and their
files), so the cost is in the layout's blocks and the shards' segments, never in the rows.

The tensor's elements are walked in row-major order: `cut` is the last dim some block does not span, the
dims after it are whole in every block (each block's row there is one contiguous range of its shard), and
the rows are the dims before it: flattened into one when every block spans them all (the tensor-parallel
splits), else dim `cut - 1` strided and the dims before it taken index by index (2-D blocks).
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections.abc import Sequence
from itertools import accumulate, pairwise, product

from inspector.errors import InspectorError
from inspector.format.dtypes import itemsize
from inspector.parse.affine import Block, Layout, row_major
from inspector.scan.model import Runs, Segment, Strided

Segs = tuple[Segment, ...]
SMALL = 1 << 12  # segments kept as a plain tuple (merged where adjacent); more become `Runs`
MAX_RECORDS = 1 << 20  # Strided records of one tensor: far more than any layout and file split gives
MAX_OUTER = 1 << 16  # indices of the dims before the strided one that are walked one by one
MAX_WORK = 1 << 22  # outer indices x block edges x blocks: the walk's cost, bounded whatever the record says
Spec = tuple[int, int, int, int]  # (shard, first element, elements per row, elements from row to row)


def lay(layout: Layout, parts: Sequence[Segs], name: str) -> Segs:
    """The tensor `layout` describes, from each shard's segments (its elements in the shard's order)."""
    full = layout.logical
    blocks = _distinct(layout)
    n = len(full)
    cut = max((d for b in blocks for d in range(n) if b.shape[d] != full[d]), default=-1)
    if cut < 0:
        b = blocks[0]
        return _finish([_plain(parts[b.rank], _flat(b.at, layout.shards[b.rank]), b.numel)], name)
    inner = math.prod(full[cut + 1 :])
    for b in blocks:
        if layout.shards[b.rank][cut + 1 :] != full[cut + 1 :]:
            raise _odd(name, "a piece's rows are not contiguous in its shard")
    if cut == 0:
        ordered = sorted(blocks, key=lambda b: b.start[0])
        return _finish(
            [_plain(parts[b.rank], _flat(b.at, layout.shards[b.rank]), b.numel) for b in ordered], name
        )
    if all(b.shape[:cut] == full[:cut] and layout.shards[b.rank][:cut] == full[:cut] for b in blocks):
        rows = math.prod(full[:cut])
        specs = [_spec(b, layout, cut, inner, cut - 1) for b in sorted(blocks, key=lambda b: b.start[cut])]
        return _finish([_rows(parts, specs, rows)], name)
    return _finish(_blocks(layout, blocks, parts, cut, inner, name), name)


def _blocks(
    layout: Layout, blocks: list[Block], parts: Sequence[Segs], cut: int, inner: int, name: str
) -> list[list[Strided]]:
    """2-D blocks: dim `cut - 1` strided between the block edges on it, the dims before it index by index."""
    full, s = layout.logical, cut - 1
    if math.prod(full[:s]) > MAX_OUTER:
        raise _odd(name, f"its pieces are cut on {cut + 1} dims over {math.prod(full[:s]):,} outer indices")
    edges = sorted({0, full[s], *(b.start[s] for b in blocks), *(b.start[s] + b.shape[s] for b in blocks)})
    if math.prod(full[:s]) * len(edges) * len(blocks) > MAX_WORK:
        raise _odd(name, f"its {len(blocks)} pieces cut {math.prod(full[:s]):,} outer indices too finely")
    out = []
    for outer in product(*(range(d) for d in full[:s])):
        for lo, hi in pairwise(edges):
            row = (*outer, lo)
            here = [
                b
                for b in blocks
                if all(a <= i < a + w for i, a, w in zip(row, b.start, b.shape, strict=False))
            ]
            here.sort(key=lambda b: b.start[cut])
            if sum(b.shape[cut] for b in here) != full[cut]:
                raise _odd(name, f"its pieces do not cover row {list(row)} once")
            specs = []
            for b in here:
                at = (*(a + i - st for a, i, st in zip(b.at, row, b.start, strict=False)), b.at[cut])
                first = _flat((*at, *b.at[cut + 1 :]), layout.shards[b.rank])
                stride = row_major(layout.shards[b.rank])[s]
                specs.append((b.rank, first, b.shape[cut] * inner, stride))
            out.append(_rows(parts, specs, hi - lo))
    return out


def _distinct(layout: Layout) -> list[Block]:
    """One block per place in the tensor: a replicated block is read from the lowest shard holding it."""
    seen: dict[tuple[tuple[int, ...], tuple[int, ...]], Block] = {}
    for b in sorted(layout.blocks, key=lambda b: b.rank):
        seen.setdefault((b.start, b.shape), b)
    return list(seen.values())


def _spec(b: Block, layout: Layout, cut: int, inner: int, s: int) -> Spec:
    shard = layout.shards[b.rank]
    return (b.rank, _flat(b.at, shard), b.shape[cut] * inner, math.prod(shard[s + 1 :]))


def _flat(at: tuple[int, ...], shape: tuple[int, ...]) -> int:
    return sum(i * st for i, st in zip(at, row_major(shape), strict=True))


def _odd(name: str, why: str) -> InspectorError:
    return InspectorError(
        f"{name}: its tensor-parallel layout cannot be read: {why}.",
        hint="The layout record is damaged or crafted; no DeepSpeed layout writes one like it.",
    )


class _Shard:
    """One shard's segments with their first elements, for finding an element by bisection."""

    def __init__(self, segs: Segs) -> None:
        self.segs = segs
        self.starts = [0, *accumulate(s.numel for s in segs)]

    def at(self, pos: int) -> int:
        return bisect_right(self.starts, pos) - 1

    def range(self, start: int, count: int) -> list[Segment]:
        out, pos, end = [], start, start + count
        j = self.at(pos)
        while pos < end:
            if j >= len(self.segs):
                raise InspectorError("A tensor-parallel piece reaches past its shard's stored elements.")
            s, base = self.segs[j], self.starts[j]
            take = min(end, base + s.numel) - pos
            out.append(Segment(s.file, s.offset + (pos - base) * itemsize(s.dtype), take, s.dtype))
            pos += take
            j += 1
        return out

    def chunks(
        self, start: int, length: int, stride: int, count: int
    ) -> list[tuple[int, int, tuple[tuple[Segment, int], ...]]]:
        """Rows i of [start + i*stride, +length) as (first row, end row, parts): a run of rows inside one
        segment is one chunk; a row across a segment boundary is a chunk of its own."""
        out: list[tuple[int, int, tuple[tuple[Segment, int], ...]]] = []
        i = 0
        while i < count:
            lo = start + i * stride
            j = self.at(lo)
            if j >= len(self.segs):
                raise InspectorError("A tensor-parallel piece reaches past its shard's stored elements.")
            s, end = self.segs[j], self.starts[j + 1]
            if lo + length <= end:
                last = count - 1 if stride == 0 else min(count - 1, (end - length - start) // stride)
                size = itemsize(s.dtype)
                seg = Segment(s.file, s.offset + (lo - self.starts[j]) * size, length, s.dtype)
                out.append((i, last + 1, ((seg, stride * size),)))
                i = last + 1
            else:
                out.append((i, i + 1, tuple((p, 0) for p in self.range(lo, length))))
                i += 1
        return out


def _plain(segs: Segs, start: int, count: int) -> list[Strided]:
    return [Strided(1, ((s, 0),)) for s in _Shard(segs).range(start, count)]


def _rows(parts: Sequence[Segs], specs: list[Spec], count: int) -> list[Strided]:
    """`count` rows, row i each spec's piece of its shard in turn: one record per run of rows whose pieces
    each stay inside one segment."""
    chunks = [_Shard(parts[r]).chunks(first, length, stride, count) for r, first, length, stride in specs]
    edges = sorted({0, count, *(c[0] for cs in chunks for c in cs)})
    out, at = [], [0] * len(chunks)
    for lo, hi in pairwise(edges):
        row: list[tuple[Segment, int]] = []
        for k, cs in enumerate(chunks):
            while cs[at[k]][1] <= lo:
                at[k] += 1
            first, _, pieces = cs[at[k]]
            for seg, stride in pieces:
                moved = seg.offset + (lo - first) * stride
                row.append((Segment(seg.file, moved, seg.numel, seg.dtype), stride))
        out.append(Strided(hi - lo, tuple(row)))
    return out


def _finish(groups: list[list[Strided]], name: str) -> Segs:
    """A plain tuple (adjacent segments merged) when short, else the records themselves."""
    records = [r for g in groups for r in g]
    if len(records) > MAX_RECORDS:
        raise _odd(name, f"it takes {len(records):,} records")
    if sum(r.count * len(r.parts) for r in records) > SMALL:
        return Runs(records)  # type: ignore[return-value]  # a Sequence[Segment], read as the tuple would be
    out: list[Segment] = []
    for r in records:
        for i in range(r.count):
            for s in r.segments(i):
                last = out[-1] if out else None
                if (
                    last
                    and last.file == s.file
                    and last.dtype == s.dtype
                    and last.offset + last.nbytes == s.offset
                ):
                    out[-1] = Segment(last.file, last.offset, last.numel + s.numel, last.dtype)
                else:
                    out.append(s)
    return tuple(out)
