"""One tensor's statistics and how two copies of it differ, on the health pass's own engine (`numerics`).

The app's `s` key asks for one tensor: it is read chunk by chunk with the converter's positioned reads (memory
is one chunk whatever its size), folded into the same `Accumulator` the health pass uses (so both give the
same figures, within the bounds numerics.py states), then read once more for a histogram of its finite
values. The generators yield progress (<= 4/s) and stop when `cancel` is set. numpy, bf16 on its bits (no
ml_dtypes but for fp8), no torch.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from inspector.convert.reader import FilePool, buffer, iter_chunks, read_segments_into
from inspector.errors import CancelledError
from inspector.format.dtypes import bits_dtype
from inspector.health.differences import compare_block
from inspector.health.numerics import GROUP, Accumulator, Array, Buffers, exact_blocks, widen_into, widened
from inspector.scan.model import Checkpoint, Segment, TensorInfo

CHUNK_ELEMS = 4 * GROUP  # a multiple of GROUP: the figures are the health pass's bits
BINS = 24
_INTERVAL = 0.25


@dataclass(frozen=True)
class StatsProgress:
    """How far a statistics pass has read (two passes: moments, then the histogram)."""

    elems_done: int
    elems_total: int
    phase: str

    @property
    def fraction(self) -> float:
        return self.elems_done / self.elems_total if self.elems_total else 1.0


@dataclass(frozen=True)
class TensorStats:
    """Summary of a tensor's values; min/max/mean/std ignore NaN and Inf (counted separately)."""

    numel: int
    minimum: float
    maximum: float
    mean: float
    std: float
    absmax: float
    zeros: int
    nans: int
    infs: int
    histogram: tuple[int, ...]
    seconds: float

    @property
    def finite(self) -> int:
        return self.numel - self.nans - self.infs


@dataclass(frozen=True)
class Difference:
    """How two copies of the same tensor differ (module copy vs master, or one tag vs another)."""

    numel: int
    differing: int
    max_abs: float
    mean_abs: float
    relative_l2: float  # ||a - b|| / ||a||


def _chunks(
    segments: Sequence[Segment], chunk_elems: int, cancel: threading.Event, pool: FilePool
) -> Iterator[Array]:
    """The tensor's values in their stored dtype (a complex tensor's moduli), `chunk_elems` at a time, in one
    reused buffer."""
    raw = buffer(chunk_elems * 8)
    for batch in iter_chunks(segments, chunk_elems):
        if cancel.is_set():
            raise CancelledError("Statistics cancelled.")
        n = read_segments_into(pool, batch, raw)
        values = raw[:n].view(bits_dtype(batch[0].dtype))
        yield np.abs(values) if values.dtype.kind == "c" else values  # complex: by modulus |z|


def tensor_stats(
    segments: Sequence[Segment],
    pool: FilePool,
    cancel: threading.Event | None = None,
    chunk_elems: int = CHUNK_ELEMS,
    bins: int = BINS,
) -> Iterator[StatsProgress | TensorStats]:
    """Yield progress, then the TensorStats of the tensor made of `segments` (read through `pool`)."""
    cancel = cancel or threading.Event()
    start = time.monotonic()
    total = sum(s.numel for s in segments)
    acc, buf = Accumulator(), Buffers(chunk_elems)
    done, last = 0, 0.0
    for x in _chunks(segments, chunk_elems, cancel, pool):
        acc.add(x, buf)
        done += x.shape[0]
        if time.monotonic() - last >= _INTERVAL:
            last = time.monotonic()
            yield StatsProgress(done, total * 2, "moments")
    st = acc.result()
    hist = np.zeros(bins, dtype=np.int64)
    if st.finite:
        lo, hi = st.minimum, st.maximum
        span = (lo, hi) if hi > lo else (lo - 0.5, lo + 0.5)
        wide = np.empty(min(chunk_elems, max(total, 1)), np.float64)
        done = 0
        for x in _chunks(segments, chunk_elems, cancel, pool):
            f = wide[: x.shape[0]]
            y = widened(x, buf)  # bf16 through buf.wide (free now), not a chunk-sized temporary
            np.copyto(f, x if y is None else y, casting="unsafe")
            hist += np.histogram(f[np.isfinite(f)], bins=bins, range=span)[0]
            done += x.shape[0]
            if time.monotonic() - last >= _INTERVAL:
                last = time.monotonic()
                yield StatsProgress(total + done, total * 2, "histogram")
    yield TensorStats(
        numel=total,
        minimum=st.minimum,
        maximum=st.maximum,
        mean=st.mean,
        std=st.std,
        absmax=st.absmax if st.finite else 0.0,
        zeros=st.zeros,
        nans=st.nan,
        infs=st.inf,
        histogram=tuple(int(v) for v in hist),
        seconds=time.monotonic() - start,
    )


def difference(
    a: Sequence[Segment],
    b: Sequence[Segment],
    pool: FilePool,
    cancel: threading.Event | None = None,
    chunk_elems: int = CHUNK_ELEMS,
) -> Iterator[StatsProgress | Difference]:
    """Yield progress, then how `b` differs from `a` (same element count; dtypes may differ): the health
    pass's float64 comparison (`differences.compare_block`: NaN on both sides is no difference, on one side an
    infinite one), a block at a time."""
    cancel = cancel or threading.Event()
    total = sum(s.numel for s in a)
    if sum(s.numel for s in b) != total:
        raise ValueError("the two tensors have different element counts")
    differing = 0
    max_abs = sum_abs = sq_diff = sq_a = 0.0
    done, last = 0, 0.0
    scratch = [np.empty(min(chunk_elems, max(total, 1)), np.float64) for _ in range(3)]
    for xa, xb in zip(
        _chunks(a, chunk_elems, cancel, pool), _chunks(b, chunk_elems, cancel, pool), strict=True
    ):
        for pa, pb in exact_blocks(xa, xb):
            k = pa.shape[0]
            fa, fb = widen_into(pa, scratch[0][:k]), widen_into(pb, scratch[1][:k])
            fin = fa[np.isfinite(fa)]  # a copy bounded by one block
            sq_a += float(np.einsum("i,i->", fin, fin))
            worst, count, abs_sum, sq = compare_block(fa, fb, scratch[2])
            max_abs, differing = max(max_abs, worst), differing + count
            sum_abs, sq_diff = sum_abs + abs_sum, sq_diff + sq
        done += xa.shape[0]
        if time.monotonic() - last >= _INTERVAL:
            last = time.monotonic()
            yield StatsProgress(done, total, "compare")
    yield Difference(
        numel=total,
        differing=differing,
        max_abs=max_abs,
        mean_abs=sum_abs / total if total else 0.0,
        relative_l2=_relative(sq_diff, sq_a),
    )


def _relative(sq_diff: float, sq_a: float) -> float:
    if sq_a:
        return math.sqrt(sq_diff) / math.sqrt(sq_a)
    return 0.0 if sq_diff == 0 else math.inf


def module_copy_segments(ckpt: Checkpoint, tensor: TensorInfo) -> tuple[Segment, ...] | None:
    """Where the 16-bit training copy of `tensor` lives in the model-states file (stage 1/2), if saved.

    Only the pickle is parsed (no data read); None when the checkpoint keeps no module copy (stage 3
    placeholders) or the copy's shape does not match."""
    if not ckpt.module_copy_bytes:
        return None
    from inspector.format.torchzip import TensorRef, load_tree

    model_file = next((f.path for f in ckpt.files if f.role == "model"), None)
    if model_file is None:
        return None
    tree = load_tree(model_file, ckpt.source)
    module = tree.get("module") if hasattr(tree, "get") else None
    if module is None or not hasattr(module, "get"):
        return None
    ref = module.get(tensor.name)
    if not isinstance(ref, TensorRef) or ref.numel != tensor.numel or ref.numel == 0:
        return None
    return tuple(Segment(ref.path, off, cnt, ref.dtype) for off, cnt in ref.runs())


__all__ = [
    "Difference",
    "StatsProgress",
    "TensorStats",
    "difference",
    "module_copy_segments",
    "tensor_stats",
]
