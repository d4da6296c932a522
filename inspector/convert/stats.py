"""Statistics of one tensor, streamed from just its bytes: numpy (+ ml_dtypes for bf16/fp8), never torch.

A tensor is read chunk by chunk with the converter's positioned reads, so memory stays at one chunk
whatever the tensor's size; the generators yield progress (<= 4/s) and stop early when `cancel` is set.
Used by the TUI's `s` key; the same functions work from a script.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from inspector.errors import CancelledError
from inspector.scan.model import Checkpoint, Segment, TensorInfo

CHUNK_ELEMS = 1 << 20
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


def numpy_dtype(name: str) -> np.dtype[Any]:
    """The numpy dtype for a checkpoint dtype name (bfloat16 and float8 via ml_dtypes)."""
    try:
        return np.dtype(name)
    except TypeError:
        import ml_dtypes  # only needed for the 16/8-bit float formats numpy lacks

        return np.dtype(getattr(ml_dtypes, name))


def _chunks(
    segments: Sequence[Segment], chunk_elems: int, cancel: threading.Event, pool: Any
) -> Iterator[np.ndarray[Any, Any]]:
    """The tensor's values as float64 chunks of at most `chunk_elems` elements (a complex tensor's moduli)."""
    from inspector.convert.reader import iter_chunks  # pure helper beside FilePool

    for batch in iter_chunks(segments, chunk_elems):
        if cancel.is_set():
            raise CancelledError("Statistics cancelled.")
        dtype = numpy_dtype(batch[0].dtype)
        raw = np.empty(sum(s.nbytes for s in batch), dtype=np.uint8)
        view = memoryview(raw)  # type: ignore[arg-type]  # numpy arrays are buffers
        pos = 0
        for seg in batch:
            pool.read_into(seg.file, seg.offset, view[pos : pos + seg.nbytes])
            pos += seg.nbytes
        values = raw.view(dtype)
        yield (np.abs(values) if dtype.kind == "c" else values).astype(np.float64)  # complex: by modulus |z|


def tensor_stats(
    segments: Sequence[Segment],
    pool: Any,
    cancel: threading.Event | None = None,
    chunk_elems: int = CHUNK_ELEMS,
    bins: int = BINS,
) -> Iterator[StatsProgress | TensorStats]:
    """Yield progress, then the TensorStats of the tensor made of `segments` (read through `pool`)."""
    cancel = cancel or threading.Event()
    start = time.monotonic()
    total = sum(s.numel for s in segments)
    n = zeros = nans = infs = 0
    mean = m2 = 0.0
    lo, hi, absmax = math.inf, -math.inf, 0.0
    done, last = 0, 0.0
    for x in _chunks(segments, chunk_elems, cancel, pool):
        done += x.size
        nan = np.isnan(x)
        inf = np.isinf(x)
        nans += int(nan.sum())
        infs += int(inf.sum())
        zeros += int((x == 0).sum())
        f = x[~(nan | inf)]
        if f.size:
            lo, hi = min(lo, float(f.min())), max(hi, float(f.max()))
            absmax = max(absmax, float(np.abs(f).max()))
            cm = float(f.mean())
            cm2 = float(((f - cm) ** 2).sum())
            tot = n + f.size
            delta = cm - mean
            mean += delta * f.size / tot  # Chan et al.: merge chunk moments without a second pass
            m2 += cm2 + delta * delta * n * f.size / tot
            n = tot
        if time.monotonic() - last >= _INTERVAL:
            last = time.monotonic()
            yield StatsProgress(done, total * 2, "moments")
    hist = np.zeros(bins, dtype=np.int64)
    if n:
        done = 0
        for x in _chunks(segments, chunk_elems, cancel, pool):
            done += x.size
            f = x[np.isfinite(x)]
            h, _ = np.histogram(f, bins=bins, range=(lo, hi) if hi > lo else (lo - 0.5, lo + 0.5))
            hist += h
            if time.monotonic() - last >= _INTERVAL:
                last = time.monotonic()
                yield StatsProgress(total + done, total * 2, "histogram")
    yield TensorStats(
        numel=total,
        minimum=lo if n else math.nan,
        maximum=hi if n else math.nan,
        mean=mean if n else math.nan,
        std=math.sqrt(m2 / n) if n else math.nan,
        absmax=absmax,
        zeros=zeros,
        nans=nans,
        infs=infs,
        histogram=tuple(int(v) for v in hist),
        seconds=time.monotonic() - start,
    )


def difference(
    a: Sequence[Segment],
    b: Sequence[Segment],
    pool: Any,
    cancel: threading.Event | None = None,
    chunk_elems: int = CHUNK_ELEMS,
) -> Iterator[StatsProgress | Difference]:
    """Yield progress, then how `b` differs from `a` (same element count; dtypes may differ)."""
    cancel = cancel or threading.Event()
    total = sum(s.numel for s in a)
    if sum(s.numel for s in b) != total:
        raise ValueError("the two tensors have different element counts")
    differing = 0
    max_abs = sum_abs = sq_diff = sq_a = 0.0
    done, last = 0, 0.0
    for xa, xb in zip(
        _chunks(a, chunk_elems, cancel, pool), _chunks(b, chunk_elems, cancel, pool), strict=True
    ):
        d = np.abs(xa - xb)
        d = np.where(np.isnan(d), np.inf, d)  # a NaN on one side only is a difference
        both_nan = np.isnan(xa) & np.isnan(xb)
        d[both_nan] = 0.0
        differing += int((d != 0).sum())
        finite = d[np.isfinite(d)]
        max_abs = max(max_abs, float(d.max()) if d.size else 0.0)
        sum_abs += float(finite.sum())
        sq_diff += float((finite**2).sum())
        sq_a += float(np.square(xa[np.isfinite(xa)]).sum())
        done += xa.size
        if time.monotonic() - last >= _INTERVAL:
            last = time.monotonic()
            yield StatsProgress(done, total, "compare")
    yield Difference(
        numel=total,
        differing=differing,
        max_abs=max_abs,
        mean_abs=sum_abs / total if total else 0.0,
        relative_l2=math.sqrt(sq_diff) / math.sqrt(sq_a) if sq_a else (0.0 if sq_diff == 0 else math.inf),
    )


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
    tree = load_tree(model_file)
    module = tree.get("module") if hasattr(tree, "get") else None
    if module is None or not hasattr(module, "get"):
        return None
    ref = module.get(tensor.name)
    if not isinstance(ref, TensorRef) or ref.numel != tensor.numel or ref.numel == 0:
        return None
    return tuple(Segment(ref.path, off, cnt, ref.dtype) for off, cnt in ref.runs())
