"""Write one universal tensor file: `{'param': fp32 tensor in full shape, 'cat_dim': 0}` streamed chunk by chunk
from the rank files' segments into a torch zip (`format.ptwriter`, fed raw bytes: no torch).

The files are independent, so the executor writes several side by side, one per worker; every worker's chunk
buffers come out of one fixed budget (`chunk_elems`), the one the safetensors pipeline holds, so 64 workers
cost no more memory than 2. A worker allocates its buffers once and keeps them for every file it writes
(buffers allocated and freed per file, by many threads at once, fragment the heap: measured 57 MiB at 2
workers, 111 MiB at 16).
"""

from __future__ import annotations

import bisect
import threading
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from inspector.convert.cast import widen_bf16
from inspector.convert.job import Writing
from inspector.convert.kinds.universal.plan import UniFile
from inspector.convert.kinds.universal.shared_rows import SharedRows
from inspector.convert.kinds.universal.tp_meta import SubparamShape
from inspector.convert.options import CHUNK_ELEMS
from inspector.convert.plan import PIPELINE_DEPTH
from inspector.convert.reader import empty
from inspector.convert.root import OutputRoot
from inspector.convert.stripes import Stripe, gather_range
from inspector.errors import CancelledError
from inspector.format.dtypes import itemsize
from inspector.scan.model import Segment
from inspector.scan.slices import RankSlices

# every worker's chunk buffers together: the safetensors pipeline's pool at its default chunk (PIPELINE_DEPTH
# fp32 source and 16-bit output buffers of CHUNK_ELEMS elements)
BUFFER_BUDGET = PIPELINE_DEPTH * CHUNK_ELEMS * (4 + 2)
BYTES_PER_ELEM = (
    10  # what `_producer` touches per element, at most: fp32 out (4), 16-bit staging (2), widened (4)
)
# elements: 512 KiB of fp32, half a core's L2 here, so the bytes read in are still in cache when they are
# checksummed and written out. A chunk larger than the caches made the write's copy into the page cache the
# whole cost: measured (perf, 200M demo, 1 worker) 15 MiB chunks spent 4.8 CPU-s in that copy, 256 KiB ones
# 0.4 s; CPU-s for the conversion 5.6-5.9 at 15 MiB, 3.7-4.9 at 1-4 MiB, 2.6-3.8 at 128-512 KiB.
MAX_CHUNK = 1 << 17
MIN_CHUNK = 1 << 14  # elements: below 64 KiB syscalls and the zip writer's per-chunk work dominate
READ_AHEAD = 16 << 20  # bytes of a tensor's source asked of the kernel ahead of its reads, from a cold page
# cache. 200M ZeRO-2 demo, pages dropped and the last output flushed before each run, 2 workers, 6
# alternating pairs: 1.66 s against 2.08 s (median; every pair faster, 0.40-0.84x)


def chunk_elems(workers: int) -> int:
    """Elements per chunk for `workers` files written at once: their buffers share BUFFER_BUDGET."""
    return max(MIN_CHUNK, min(MAX_CHUNK, BUFFER_BUDGET // (max(1, workers) * BYTES_PER_ELEM)))


class Buffers(threading.local):
    """Each worker thread's chunk buffers, made on its first file and kept for the rest."""

    out: np.ndarray | None = None
    raw: np.ndarray | None = None

    def get(self, chunk: int) -> tuple[np.ndarray, np.ndarray]:
        if self.out is None or self.raw is None:
            self.out, self.raw = empty(chunk, np.float32), empty(chunk, np.uint16)  # reads land on a page
        return self.out, self.raw


def write_tensor(
    pool: Any,
    f: UniFile,
    root: OutputRoot,
    rel: str,
    w: Writing,
    chunk: int,
    buffers: Buffers,
    ahead: int = 0,
    shared: tuple[SharedRows, int] | None = None,
) -> None:
    """`f` at `rel`, in place all at once (written as `rel.tmp`, renamed when complete). `ahead`: bytes of
    its source to keep asked of the kernel before they are read (`READ_AHEAD` from a cold page cache).
    `shared`: the plan's stripes and `f`'s index there; a file in a stripe is gathered from its rows."""
    from inspector.format import ptwriter as pw  # the torch-zip writer (lazily: plan/preflight stay light)

    st = shared[0].stripe(shared[1]) if shared is not None else None
    if shared is not None and st is not None:
        produce = _gatherer(shared[0], shared[1], st, f, w, *buffers.get(chunk))
    else:
        produce = _producer(pool, f, w, *buffers.get(chunk), ahead=ahead)
    storage = pw.Storage("float32", numel(f.shape), produce)
    tree = {"param": pw.Tensor(storage, f.shape), **{k: _pickled(v, pw) for k, v in f.meta}}
    archive = f.state  # torch names the archive folder after the file
    sums: list[tuple[int, int]] = []
    try:
        root.write_with(rel, lambda fh: sums.append(pw.dump_crc(tree, fh, archive, chunk)), fsync=w.fsync)
    finally:
        if shared is not None and st is not None:
            shared[0].written(shared[1])
    w.checksummed(*sums[0])  # the journal's CRC, from the zip's own checksums: the file is not read back


def _pickled(value: Any, pw: Any) -> Any:
    """A metadata value as DeepSpeed pickles it: a SubparamShape as its own class, the rest as is."""
    if isinstance(value, SubparamShape):
        return pw.Obj(pw.Global("deepspeed.checkpoint.universal_checkpoint", "SubparamShape"), value.state())
    return value


def numel(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def _producer(
    pool: Any, f: UniFile, w: Writing, buf: np.ndarray, staging: np.ndarray, ahead: int = 0
) -> Callable[[int, int], Any]:
    """Elements [start, start+count) of the tensor as fp32 bytes, read from its segments into the worker's
    buffer (a 16-bit source into `staging` first, then widened into it). With `ahead`, the `ahead` bytes of
    its source past the chunk being read are kept asked of the kernel (`FilePool.advise`), half a window at
    a time, so a cold disk reads them while this worker checksums and writes."""
    src_size = itemsize(f.source_dtype)
    starts = []
    acc = 0
    for s in f.segments:
        starts.append(acc)
        acc += s.numel
    raw = staging if src_size == 2 else None
    window = ahead // src_size  # elements
    advised = [0]  # elements of the tensor asked for so far

    def runs(pos: int, end: int) -> Iterator[tuple[int, Segment, int, int]]:
        """(element, its segment, the first element there, how many) of elements [pos, end)."""
        i = bisect.bisect_right(starts, pos) - 1
        while pos < end:
            seg = f.segments[i]
            local = pos - starts[i]
            take = min(end - pos, seg.numel - local)
            yield pos, seg, local, take
            pos += take
            i += 1

    def produce(start: int, count: int) -> Any:
        if w.cancel.is_set():
            raise CancelledError("Conversion cancelled.")
        if window and advised[0] < start + count + window // 2:  # this chunk, if not yet, and a window on
            upto = min(acc, start + count + window)
            for _, seg, local, take in runs(advised[0], upto):
                pool.advise(seg.file, seg.offset + local * src_size, take * src_size)
            advised[0] = upto
        out = buf[:count]
        target = out.view(np.uint8) if raw is None else raw[:count].view(np.uint8)
        for pos, seg, local, take in runs(start, start + count):
            a = (pos - start) * src_size
            pool.read_into(seg.file, seg.offset + local * src_size, target.data[a : a + take * src_size])
        if raw is not None:
            _widen(raw[:count], f.source_dtype, out)
        w.progress(count * 4, f.name)
        return out

    return produce


def _gatherer(
    shared: SharedRows, index: int, st: Stripe[Any], f: UniFile, w: Writing, buf: np.ndarray, staging: np.ndarray
) -> Callable[[int, int], Any]:
    """Elements [start, start+count) of a file in a stripe as fp32 bytes, gathered from the stripe's rows
    (read by the first worker that needs them) into the worker's buffer, a 16-bit source widened."""
    slices = f.segments
    assert isinstance(slices, RankSlices)  # a stripe's files are stage-3 slices

    def produce(start: int, count: int) -> Any:
        if w.cancel.is_set():
            raise CancelledError("Conversion cancelled.")
        rows = shared.rows(index)
        out = buf[:count]
        if itemsize(f.source_dtype) == 2:
            gather_range(st, rows, slices, start, count, staging[:count].view(rows.dtype))
            _widen(staging[:count], f.source_dtype, out)
        else:
            gather_range(st, rows, slices, start, count, out.view(rows.dtype))
        w.progress(count * 4, f.name)
        return out

    return produce


def _widen(src: np.ndarray, dtype: str, out: np.ndarray) -> None:
    """16-bit to fp32 exactly, in place in `out` (bf16 is the top half of an fp32; fp16 through numpy's exact
    upcast)."""
    if dtype == "bfloat16":
        widen_bf16(src, out.view(np.uint32))
    else:
        out[:] = src.view(np.float16)
