"""Positioned reads of exactly the bytes a tensor needs, into caller-owned buffers.

Files are opened through the confined byte source by the run's `FilePool` (`filepool.py`; its names are
importable from here too): locally O_RDONLY and read with `os.preadv`, remotely by ranged GETs. A checkpoint
is never modified, nothing is mapped into our address space (RSS stays honest), and threads share one handle.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import numpy as np

from inspector.convert.filepool import FilePool as FilePool  # the pool readers take, importable from here
from inspector.convert.filepool import open_cap as open_cap
from inspector.format.dtypes import bits_dtype, itemsize, numpy_dtype
from inspector.format.torchzip import TensorRef
from inspector.scan.model import Checkpoint, Runs, Segment


def bytes_by_file(segments: Iterable[Segment]) -> Counter[str]:
    """Bytes a run reads from each file (path -> bytes), for residency and preflight's calibration."""
    return reads_of(segments)[0]


def add_reads(segments: Sequence[Segment], by_file: Counter[str]) -> int:
    """Add one tensor's bytes to `by_file`; returns its reads (`reads_of`). A stage-3 parameter's
    `RankSlices` from its rank table, one read a rank, no segment made (thousands of ranks)."""
    from inspector.scan.slices import RankSlices

    if not isinstance(segments, RankSlices):
        got, n = reads_of(segments)
        by_file.update(got)
        return n
    n = len(segments)
    if n:
        files, size = segments.starts.files, segments.starts.itemsize
        for f in files[: n - 1]:
            by_file[f] += segments.part * size
        by_file[files[n - 1]] += (segments.numel - (n - 1) * segments.part) * size
    return n


def reads_of(segments: Iterable[Segment]) -> tuple[Counter[str], int]:
    """(bytes read from each file, how many reads): segments adjacent in one file are one read, as
    `read_segments_into` merges them. Preflight's time model charges each read (a call and its Python
    bookkeeping, `calibrate.RANGE_COST`): a stage-3 parameter is one read a rank."""
    reads: Counter[str] = Counter()
    ranges, last, end = 0, "", -1
    for seg in segments:
        n = seg.nbytes
        reads[seg.file] += n
        if seg.file != last or seg.offset != end:
            ranges += 1
        last, end = seg.file, seg.offset + n
    return reads, ranges


_RUNS_AT_ONCE = 4096  # runs listed before they are read (a store reads them together, several in flight)


def byte_view(a: np.ndarray[Any, Any]) -> memoryview:
    """A writable byte memoryview over a contiguous array (bf16 and fp8 arrays included)."""
    return a.reshape(-1).view(np.uint8).data


PAGE = 4096


def buffer(nbytes: int) -> np.ndarray[Any, Any]:
    """A raw byte buffer that reads land in, starting on a page (numpy, not bytearray: typed views of it need
    no copy). The kernel's copy from the page cache (`rep movsb`) runs 2.5-6.5x slower when the buffer lies
    4-16 bytes past the source within a page (results.md, "a page-cache read's speed depends on where its
    buffer sits"), and numpy starts large buffers 16 bytes into a page: every record torch saved on a page
    boundary (1 in 64: records are 64-byte aligned) was read at ~5.8 GB/s instead of ~14. From a page, a
    64-byte aligned source is never in that band. The slack page is never touched (RSS does not grow)."""
    raw = np.empty(nbytes + PAGE, dtype=np.uint8)
    start = -raw.ctypes.data % PAGE
    return raw[start : start + nbytes]


def empty(numel: int, dtype: np.dtype[Any] | type) -> np.ndarray[Any, Any]:
    """`np.empty(numel, dtype)` in a `buffer`: an array a read fills."""
    dt = np.dtype(dtype)
    return buffer(numel * dt.itemsize).view(dt)


class Window(Sequence[Segment]):
    """Elements [skip, skip + numel) of a `Runs` from its segment `first` on, cut into segments as they are
    walked: a chunk of a join of a million rows is one small object, not a list of its rows."""

    __slots__ = ("first", "numel", "runs", "skip")

    def __init__(self, runs: Runs, first: int, skip: int, numel: int) -> None:
        self.runs, self.first, self.skip, self.numel = runs, first, skip, numel

    def __iter__(self) -> Iterator[Segment]:
        left, skip = self.numel, self.skip
        for seg in self.runs.iter_from(self.first):
            take = min(seg.numel - skip, left)
            if take > 0:
                yield Segment(seg.file, seg.offset + skip * itemsize(seg.dtype), take, seg.dtype)
            left, skip = left - max(take, 0), 0
            if not left:
                return

    def __len__(self) -> int:
        return sum(1 for _ in self)

    def __getitem__(self, i: Any) -> Any:
        return tuple(self)[i]


def _windows(runs: Runs, chunk_elems: int) -> Iterator[Window]:
    """`iter_chunks` of a `Runs`: each chunk a `Window`, the segments walked once, none kept."""
    first, skip, room = 0, 0, chunk_elems
    for i, seg in enumerate(runs):
        at = 0
        while seg.numel - at >= room:  # a chunk ends in (or at the end of) this segment
            yield Window(runs, first, skip, chunk_elems)
            at += room
            first, skip = (i + 1, 0) if at == seg.numel else (i, at)
            room = chunk_elems
        room -= seg.numel - at
    if room < chunk_elems:
        yield Window(runs, first, skip, chunk_elems - room)


def iter_chunks(segments: Sequence[Segment], chunk_elems: int) -> Iterator[Sequence[Segment]]:
    """Cut a tensor's segments into pieces of at most `chunk_elems` elements, in order."""
    if isinstance(segments, Runs):
        yield from _windows(segments, chunk_elems)
        return
    batch: list[Segment] = []
    room = chunk_elems
    for seg in segments:
        off, left = seg.offset, seg.numel
        size = itemsize(seg.dtype)
        while left:
            take = min(left, room)
            batch.append(Segment(seg.file, off, take, seg.dtype))
            off += take * size
            left -= take
            room -= take
            if room == 0:
                yield batch
                batch, room = [], chunk_elems
    if batch:
        yield batch


def read_segments_into(pool: FilePool, segments: Iterable[Segment], out: np.ndarray[Any, Any]) -> int:
    """Read segments back to back into the flat array `out`; returns bytes read."""
    view = byte_view(out)
    runs: list[tuple[str, int, memoryview]] = []
    pos = 0
    for seg in segments:  # segments adjacent in one file are read as one run (one GET on a store)
        n = seg.nbytes
        if runs and runs[-1][0] == seg.file and runs[-1][1] + len(runs[-1][2]) == seg.offset:
            path, offset, _ = runs[-1]
            runs[-1] = (path, offset, view[pos - (seg.offset - offset) : pos + n])
        else:
            if len(runs) >= _RUNS_AT_ONCE:  # a chunk of a million rows: read in batches, never all listed
                pool.read_runs(runs)
                runs.clear()
            runs.append((seg.file, seg.offset, view[pos : pos + n]))
        pos += n
    pool.read_runs(runs)
    return pos


def read_bits(pool: FilePool, segments: Sequence[Segment], dtype: str) -> np.ndarray[Any, Any]:
    """The segments back to back in their stored dtype, bf16 as its bits (`bits_dtype`: no ml_dtypes import,
    ~0.9 CPU-s, for code that only widens or compares them)."""
    out = empty(sum(s.numel for s in segments), bits_dtype(dtype))
    read_segments_into(pool, segments, out)
    return out


def read_segments(pool: FilePool, segments: Sequence[Segment], dtype: str) -> np.ndarray[Any, Any]:
    out = empty(sum(s.numel for s in segments), numpy_dtype(dtype))
    read_segments_into(pool, segments, out)
    return out


def read_tensor(
    ckpt: Checkpoint, name: str, state: str = "fp32", pool: FilePool | None = None
) -> np.ndarray[Any, Any]:
    """A whole tensor in its source dtype (fp32 master for trainable params). For tests and small tensors."""
    info = ckpt.tensor(name)
    segments = info.segments if state == "fp32" else dict(info.moments)[state]
    dtype = segments[0].dtype if segments else info.dtype
    own = pool is None
    pool = pool or FilePool(ckpt.source)
    try:
        return read_segments(pool, segments, dtype).reshape(info.shape)
    finally:
        if own:
            pool.close()


def read_ref(ref: TensorRef) -> np.ndarray[Any, Any]:
    """Materialise a small TensorRef (step counters, buffers) honouring its strides."""
    segs = [Segment(ref.path, off, n, ref.dtype) for off, n in ref.runs()]
    with FilePool() as pool:
        return read_segments(pool, segs, ref.dtype).reshape(ref.shape)
