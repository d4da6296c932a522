"""Chunks to segments: a tensor's chunks (global offsets and sizes, each stored contiguous) as the runs of its
row-major bytes, and the proof that they tile it: no gap, no overlap, nothing past its edge.

A row slab (FSDP's dim-0 shards) is one run. A block split on a later dimension (TP+FSDP's 2-D blocks) is one
run per row of the dimensions before the split; `runs` is the one function that makes them, so the compact
strided form of a TP join can replace it in one place.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from itertools import pairwise, product
from typing import TYPE_CHECKING

from inspector.format.dtypes import itemsize
from inspector.scan.model import Runs, Segment, Strided
from inspector.scan.tensor_lay import SMALL

if TYPE_CHECKING:
    import numpy as np


@dataclass(frozen=True, slots=True)
class Chunk:
    """One stored piece: where it sits in the tensor and where its bytes start in `file`."""

    offsets: tuple[int, ...]
    sizes: tuple[int, ...]
    file: str
    offset: int

    @property
    def numel(self) -> int:
        return math.prod(self.sizes)


class TilingError(ValueError):
    """The chunks do not tile the tensor; the message says how."""


def _split_dim(shape: tuple[int, ...], chunks: Sequence[Chunk]) -> int:
    """The last dimension some chunk does not span whole: every dimension after it is whole in every chunk."""
    k = 0
    for d in range(len(shape)):
        if any(c.offsets[d] != 0 or c.sizes[d] != shape[d] for c in chunks):
            k = d
    return k


def _check_bounds(shape: tuple[int, ...], chunks: Sequence[Chunk]) -> None:
    for c in chunks:
        if len(c.offsets) != len(shape) or len(c.sizes) != len(shape):
            raise TilingError(f"a chunk of rank {len(c.sizes)} in a tensor of rank {len(shape)}")
        for o, s, n in zip(c.offsets, c.sizes, shape, strict=True):
            if o + s > n:
                raise TilingError(f"a chunk at {list(c.offsets)} of size {list(c.sizes)} runs past its edge")


def _tile_line(row: Sequence[Chunk], k: int, length: int, where: str) -> None:
    pos = 0
    for c in row:
        if c.offsets[k] != pos:
            what = "overlap" if c.offsets[k] < pos else "a gap"
            raise TilingError(
                f"the chunks {where}leave {what} at index {min(pos, c.offsets[k])} of dimension {k}"
            )
        pos += c.sizes[k]
    if pos != length:
        raise TilingError(f"the chunks {where}cover {pos} of the {length} indices of dimension {k}")


def runs(shape: tuple[int, ...], dtype: str, chunks: Sequence[Chunk]) -> Sequence[Segment]:
    """The tensor's bytes in row-major order as segments, adjacent ones merged; `TilingError` when the
    chunks do not tile it exactly."""
    live = [c for c in chunks if c.numel > 0]  # FSDP2 records empty chunks (size 0, offset at the edge)
    _check_bounds(shape, chunks)
    if not shape:
        if len(live) != 1:
            raise TilingError(f"a 0-d tensor stored in {len(live)} chunks")
        return [Segment(live[0].file, live[0].offset, 1, dtype)]
    if math.prod(shape) == 0:
        return []
    k = _split_dim(shape, live)
    if k == 1 and len(shape) == 2:  # 2-D blocks (TP+FSDP): one strided record per band of rows
        return _blocks(shape, dtype, live)
    inner = math.prod(shape[k + 1 :])
    size = itemsize(dtype)
    out: list[Segment] = []
    for prefix, row in _rows(shape, k, live):
        where = f"at {list(prefix)} " if prefix else ""
        _tile_line(row, k, shape[k], where)
        for c in row:
            local = [p - o for p, o in zip(prefix, c.offsets, strict=False)]
            line = _ravel(local, c.sizes[:k])
            start = c.offset + line * c.sizes[k] * inner * size
            _append(out, Segment(c.file, start, c.sizes[k] * inner, dtype))
    return out


def slabs(
    shape: tuple[int, ...], dtype: str, dims: np.ndarray, files: Sequence[str], offsets: Sequence[int]
) -> list[Segment] | None:
    """`runs` of chunks given as rows of `dims` (offsets then sizes), `files` and `offsets`, when they are
    all row slabs (whole along every dimension but the first: FSDP's shards) that tile the first dimension:
    the same segments, checked in numpy passes instead of chunk by chunk. None for anything else (then
    `runs` lays the chunks, or says why they do not tile)."""
    import numpy as np

    nd = len(shape)
    if not nd or math.prod(shape) == 0 or not len(dims) or max(shape) >= 1 << 40 or len(dims) >= 1 << 22:
        return None  # a 0-d or empty tensor; sizes whose sums could overflow int64
    bound = np.asarray(shape, dtype=np.int64)
    lo, size = dims[:, :nd], dims[:, nd:]
    if bool((dims < 0).any()) or bool((lo + size > bound).any()):
        return None
    live = np.flatnonzero((size > 0).all(axis=1))  # FSDP2 records empty chunks: no bytes, no segment
    if not len(live) or bool((lo[live, 1:] != 0).any()) or bool((size[live, 1:] != bound[1:]).any()):
        return None
    order = live[np.argsort(lo[live, 0], kind="stable")]
    first, rows = lo[order, 0], size[order, 0]
    ends = np.cumsum(rows)
    if first[0] != 0 or bool((first[1:] != ends[:-1]).any()) or ends[-1] != shape[0]:
        return None
    inner = math.prod(shape[1:])
    out: list[Segment] = []
    for i, n in zip(order.tolist(), rows.tolist(), strict=True):
        _append(out, Segment(files[i], offsets[i], n * inner, dtype))
    return out


def _blocks(shape: tuple[int, ...], dtype: str, live: Sequence[Chunk]) -> Sequence[Segment]:
    """A matrix cut in column blocks as well as rows: each band of rows held by the same chunks is one
    `Strided` record (row r is each chunk's row r in column order), however many rows it has."""
    size, bands = itemsize(dtype), []
    cuts = sorted({0, shape[0], *(c.offsets[0] for c in live), *(c.offsets[0] + c.sizes[0] for c in live)})
    for lo, hi in pairwise(cuts):
        row = sorted((c for c in live if c.offsets[0] <= lo < c.offsets[0] + c.sizes[0]), key=lambda c: c.offsets[1])
        _tile_line(row, 1, shape[1], f"at [{lo}] ")
        parts = tuple(
            (Segment(c.file, c.offset + (lo - c.offsets[0]) * c.sizes[1] * size, c.sizes[1], dtype), c.sizes[1] * size)
            for c in row
        )
        bands.append(Strided(hi - lo, parts))
    every = Runs(bands)
    if len(every) > SMALL:  # as the tensor-parallel joins: short ones stay plain, merged
        return every
    out: list[Segment] = []
    for seg in every:
        _append(out, seg)
    return out


def _rows(
    shape: tuple[int, ...], k: int, live: Sequence[Chunk]
) -> Iterator[tuple[tuple[int, ...], list[Chunk]]]:
    """Each index of the dimensions before `k` with the chunks holding it, ordered along dimension `k`."""
    if k == 0:
        yield (), sorted(live, key=lambda c: c.offsets[0])
        return
    cuts = sorted({0, shape[0], *(c.offsets[0] for c in live), *(c.offsets[0] + c.sizes[0] for c in live)})
    for lo, hi in pairwise(cuts):
        band = [c for c in live if c.offsets[0] <= lo < c.offsets[0] + c.sizes[0]]
        for r in range(lo, hi):
            for rest in product(*(range(n) for n in shape[1:k])):
                prefix = (r, *rest)
                held = [c for c in band if _holds(c, prefix)]
                yield prefix, sorted(held, key=lambda c: c.offsets[k])


def _holds(c: Chunk, prefix: tuple[int, ...]) -> bool:
    return all(o <= p < o + s for p, o, s in zip(prefix, c.offsets, c.sizes, strict=False))


def _ravel(index: Sequence[int], sizes: Sequence[int]) -> int:
    flat = 0
    for i, n in zip(index, sizes, strict=True):
        flat = flat * n + i
    return flat


def _append(out: list[Segment], seg: Segment) -> None:
    """Add `seg`, merged into the last run when its bytes continue it in the same file."""
    if out and out[-1].file == seg.file and out[-1].offset + out[-1].nbytes == seg.offset:
        last = out[-1]
        out[-1] = Segment(last.file, last.offset, last.numel + seg.numel, last.dtype)
    else:
        out.append(seg)
