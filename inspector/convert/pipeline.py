"""Write one shard with every worker reading, casting and writing chunks of its tensors at once, in one
fixed memory budget.

A producer thread walks the shard's chunks in file order; each takes a source buffer (and an output buffer
when its dtype changes) from fixed pools and goes to a worker. A chunk that needs no cast is copied file to
file in the kernel (`os.copy_file_range`; its buffer is the fallback where the file systems refuse) and never
enters Python; any other the worker reads exactly its bytes, casts them (numpy + ml_dtypes, bit-identical
to torch's `.to(dtype)`; the common fp32 -> bf16 on the bits in integer ufuncs that release the GIL, with
no ml_dtypes import: `cast.cast_raw`) and `pwrite`s them at their planned offset, then returns the buffers:
chunks of different tensors are in flight at once, as many as there are workers, and the order they finish
in changes no byte. The buffers are the plan's one budget (`plan.buffer_bytes`) whatever the worker count:
more workers get more, smaller buffers (`pool_plan`), never more memory, and shards written side by side take their chunks from the same pools.
From an object store each worker's read is a round trip, so at least `plan.depth` are in flight. A tensor
whose output is computed rather than cast (a LoRA merge: `ChunkMath`) goes the same way, its chunks computed
on the workers.

This is the part of a conversion that moves bytes; the executor (`executor.run`) decides which shards to
write and owns everything around them (output folder, journal, renames, progress events, cancel).
"""

from __future__ import annotations

import errno
import os
import queue
import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from inspector.convert.cast import cast_raw
from inspector.convert.filepool import SharedPool
from inspector.convert.plan import ConversionPlan, PlannedShard, PlannedTensor
from inspector.convert.reader import FilePool, buffer, iter_chunks, read_segments_into
from inspector.convert.stripes import Stripe, fill_gaps, gather, runs, stripe_reads
from inspector.errors import CancelledError
from inspector.format.dtypes import bits_dtype, itemsize
from inspector.scan.model import Segment
from inspector.system import limits


class ChunkMath(Protocol):
    """Computes the output of tensors that are not their source bytes cast (a LoRA merge), chunk by chunk on
    the workers: `prepare` (on the producer, once per tensor) returns what its chunks need, or None for a
    plain tensor; `apply` writes elements [start, start + len(src)) of the output into `out` (which may be
    `src` itself: the same buffer when the dtype does not change). Both are viewed with `bits_dtype`: bf16
    as its bits, so a merge into bf16 imports no ml_dtypes."""

    def prepare(self, pool: FilePool, t: PlannedTensor) -> object | None: ...

    def apply(self, ctx: object, t: PlannedTensor, start: int, src: np.ndarray, out: np.ndarray) -> None: ...


SIDE_BY_SIDE = 2  # shards in flight at once (one pool of buffers: more would only split it further)
MIN_CHUNK = 1 << 18  # elements: a worker's chunk never shrinks below 1 MiB of fp32 (syscalls stay noise)
PoolPair = tuple["queue.Queue[np.ndarray]", "queue.Queue[np.ndarray]"]  # (source, output) buffers


def plan_threads(plan: ConversionPlan) -> int:
    """Workers for `plan`: the one rule (`limits.workers`) applied to its `--workers`."""
    return limits.workers(plan.options.workers, plan.remote)


def shards_at_once(plan: ConversionPlan) -> int:
    """Shards written side by side: SIDE_BY_SIDE when there are that many and more than one worker, from
    the one pool of buffers (`shard_streamer`)."""
    return min(SIDE_BY_SIDE, len(plan.shards)) if plan_threads(plan) > 1 else 1


def _sizes(plan: ConversionPlan, limit: int) -> tuple[int, int]:
    return (
        max((s.buffer_size(limit) for s in plan.shards), default=16),
        max((s.out_buffer_size(limit) for s in plan.shards), default=0),
    )


def pool_plan(plan: ConversionPlan, workers: int) -> tuple[int, int]:
    """(buffers per pool, elements per chunk) for `workers`: one chunk in flight per worker and one being
    filled, in the plan's own budget (`plan.buffer_bytes`): chunks shrink as workers grow (not below
    MIN_CHUNK), and past what the budget holds at MIN_CHUNK the extra workers wait for buffers."""
    depth, limit = plan.depth, plan.chunk_limit
    want = workers + 1
    if want <= depth:
        return depth, limit
    small = max(min(limit, MIN_CHUNK), limit * depth // want // 4096 * 4096)
    src, out = _sizes(plan, small)
    return max(depth, min(want, plan.buffer_bytes // max(1, src + out))), small


def _pwrite_all(fd: int, data: memoryview, offset: int) -> None:
    while data:
        n = os.pwrite(fd, data, offset)
        data = data[n:]
        offset += n


def make_pools(plan: ConversionPlan, depth: int | None = None, limit: int | None = None) -> PoolPair:
    """The run's whole memory budget: `depth` source and output buffers for chunks of `limit` elements
    (the plan's own by default), allocated once."""
    depth = depth or plan.depth
    src_bytes, out_bytes = _sizes(plan, limit or plan.chunk_limit)
    src_pool: queue.Queue[np.ndarray] = queue.Queue()
    out_pool: queue.Queue[np.ndarray] = queue.Queue()
    for _ in range(depth):
        src_pool.put(buffer(src_bytes))
        if out_bytes:
            out_pool.put(buffer(out_bytes))
    return src_pool, out_pool


def _take(pool: queue.Queue[np.ndarray], stop: threading.Event) -> np.ndarray | None:
    while not stop.is_set():
        try:
            return pool.get(timeout=0.1)
        except queue.Empty:
            continue
    return None


class _KernelCopy:
    """Copies byte ranges file to file with `os.copy_file_range`; off for the run once the kernel or the
    file systems refuse (EXDEV across file systems on Linux >= 5.19, ENOSYS, EOPNOTSUPP, EINVAL)."""

    def __init__(self) -> None:
        self.enabled = hasattr(os, "copy_file_range") and os.environ.get("ZI_NO_COPY_FILE_RANGE") != "1"

    def copy(self, src_fd: int, src_off: int, dst_fd: int, dst_off: int, n: int) -> bool:
        """True when all `n` bytes were copied; False (nothing to undo) when the caller must copy them."""
        if not self.enabled:
            return False
        done = 0
        while done < n:
            try:
                k = os.copy_file_range(src_fd, dst_fd, n - done, src_off + done, dst_off + done)
            except OSError as exc:
                if exc.errno in (errno.ENOSPC, errno.EDQUOT, errno.EIO):
                    raise
                self.enabled = False
                return False
            if k == 0:  # source shorter than planned: let the buffered path name the truncated file
                self.enabled = False
                return False
            done += k
        return True


def _kernel_copy(kernel: _KernelCopy, pool: FilePool, fd: int, segs: Sequence[Segment], pos: int) -> bool:
    """Copy a no-cast chunk in the kernel; False: the buffered path must (re)write the whole chunk."""
    for seg in segs:
        with pool.using(seg.file) as handle:  # open until copied, whatever other workers open meanwhile
            src = handle.fileno()
            if src is None or not kernel.copy(src, seg.offset, fd, pos, seg.nbytes):  # None: a remote object
                return False
        pos += seg.nbytes
    return True


@dataclass
class _ShardIO:
    """What the producer and the workers of one shard share."""

    fd: int
    cancel: threading.Event
    pools: PoolPair
    files: FilePool
    stop: threading.Event = field(default_factory=threading.Event)
    errors: list[BaseException] = field(default_factory=list)
    written: int = 0
    tensor: str = ""
    lock: threading.Lock = field(default_factory=threading.Lock)
    math: ChunkMath | None = None

    def count(self, nbytes: int, tensor: str) -> None:
        with self.lock:
            self.written += nbytes
            self.tensor = tensor

    def fail(self, exc: BaseException) -> None:
        self.errors.append(exc)
        self.stop.set()


@dataclass(frozen=True)
class _Chunk:
    """One worker's piece of a tensor: its segments, where its bytes go, its first element in the tensor,
    and what `ChunkMath.prepare` gave for the tensor (None: its bytes, cast)."""

    t: PlannedTensor
    segs: Sequence[Segment]
    pos: int
    start: int
    ctx: object | None = None


def _bits(buf: np.ndarray, dtype: str, count: int) -> np.ndarray:
    """The first `count` elements of a raw byte buffer viewed as `dtype` (`bits_dtype`: bf16 as its bits)."""
    dt = bits_dtype(dtype)
    return buf[: count * dt.itemsize].view(dt)


@contextmanager
def _returned(io: _ShardIO, src: np.ndarray, out: np.ndarray | None) -> Iterator[None]:
    """A worker's chunk or stripe: its error stops the shard, its buffers go back to their pools whatever
    happens."""
    try:
        yield
    except BaseException as exc:
        io.fail(exc)
    finally:
        io.pools[0].put(src)
        if out is not None:
            io.pools[1].put(out)


def _work(
    io: _ShardIO, c: _Chunk, src: np.ndarray, out: np.ndarray | None, kernel: _KernelCopy | None
) -> None:
    """One worker's chunk: copied file to file in the kernel when it needs no cast (`kernel`) and the kernel
    takes it; else read into `src`, cast into `out` if the dtype changes (or computed, with `c.ctx`), and
    written at `c.pos`."""
    t = c.t
    n = sum(s.numel for s in c.segs)
    with _returned(io, src, out):
        if io.stop.is_set() or io.cancel.is_set():
            return
        if kernel is not None and _kernel_copy(kernel, io.files, io.fd, c.segs, c.pos):
            io.count(n * itemsize(t.out_dtype), t.name)
            return
        read_segments_into(io.files, c.segs, src)
        data = src if out is None else out
        if c.ctx is not None and io.math is not None:
            io.math.apply(c.ctx, t, c.start, _bits(src, t.src_dtype, n), _bits(data, t.out_dtype, n))
        elif out is not None:
            cast_raw(src, t.src_dtype, out, t.out_dtype, n)
        nbytes = n * itemsize(t.out_dtype)
        _pwrite_all(io.fd, memoryview(data)[:nbytes], c.pos)  # type: ignore[arg-type]  # a uint8 array
        io.count(nbytes, t.name)


def _work_stripe(io: _ShardIO, st: Stripe[PlannedTensor], pos: int, src: np.ndarray, out: np.ndarray | None) -> None:
    """One worker's stripe (`convert/stripes.py`): a window of every rank's flat tensor read into `src` as
    rows, cast as rows into `out` when the dtype changes, each tensor gathered back to back (into `src`
    once cast, else into its second half) and written at `pos`."""
    with _returned(io, src, out):
        if io.stop.is_set() or io.cancel.is_set():
            return
        view = memoryview(src)  # type: ignore[arg-type]  # a uint8 array
        io.files.read_runs([(f, off, view[at : at + n]) for f, off, at, n in stripe_reads(st)])
        fill_gaps(st, src)
        first, n = st.tensors[0], st.numel
        if out is not None:
            cast_raw(src, first.src_dtype, out, first.out_dtype, st.rows)
            rows, dst = _bits(out, first.out_dtype, st.rows), _bits(src, first.out_dtype, n)
        else:
            used = st.rows * itemsize(first.src_dtype)
            rows, dst = _bits(src, first.src_dtype, st.rows), _bits(src[used:], first.src_dtype, n)
        gather(st, rows, dst)
        nbytes = n * itemsize(first.out_dtype)
        _pwrite_all(io.fd, memoryview(dst.view(np.uint8))[:nbytes], pos)  # type: ignore[arg-type]
        io.count(nbytes, st.tensors[-1].name)


def _buffers(io: _ShardIO, cast: bool) -> tuple[np.ndarray, np.ndarray | None] | None:
    """A chunk's or a stripe's (source, output) buffers, waited for (that bounds what is in flight; a kernel
    copy holds a source buffer too: the fallback's, and the bound); None once the shard stops or is
    cancelled."""
    if io.cancel.is_set() or io.stop.is_set():
        return None
    src = _take(io.pools[0], io.stop)
    out = _take(io.pools[1], io.stop) if cast else None
    if src is None or (cast and out is None):
        return None
    return src, out


def _produce(io: _ShardIO, plan: ConversionPlan, index: int, limit: int, ex: ThreadPoolExecutor) -> None:
    """Walk the shard's chunks in file order, each to a worker with its buffers (waiting for them bounds
    what is in flight); runs of small stage-3 parameters go as stripes (none where tensors are computed)."""
    shard = plan.shards[index]
    kernel = _KernelCopy()
    try:
        for t in runs(shard, limit) if io.math is None else shard.tensors:
            if isinstance(t, Stripe):
                first = t.tensors[0]
                if (bufs := _buffers(io, first.src_dtype != first.out_dtype)) is None:
                    return
                ex.submit(_work_stripe, io, t, len(shard.header) + t.tensors[0].offset, *bufs)
                continue
            pos, start = len(shard.header) + t.offset, 0
            osz = itemsize(t.out_dtype)
            cast = t.src_dtype != t.out_dtype
            ctx = io.math.prepare(io.files, t) if io.math is not None else None
            for segs in iter_chunks(t.segments, shard.chunk_elems(t, limit)):
                if (bufs := _buffers(io, cast)) is None:
                    return
                copy = None if cast or ctx is not None else kernel
                ex.submit(_work, io, _Chunk(t, segs, pos, start, ctx), *bufs, copy)
                n = sum(s.numel for s in segs)
                pos, start = pos + n * osz, start + n
    except BaseException as exc:
        io.fail(exc)


def _allocate(fd: int, shard: PlannedShard) -> None:
    """Reserve the shard's whole size and write its header."""
    try:
        os.posix_fallocate(fd, 0, shard.file_bytes)
    except OSError as exc:
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            raise
        os.ftruncate(fd, shard.file_bytes)  # file system without fallocate
    _pwrite_all(fd, memoryview(shard.header), 0)


def shard_streamer(
    plan: ConversionPlan, math: ChunkMath | None = None
) -> Callable[[int, int, threading.Event, bool], Iterator[tuple[int, str]]]:
    """The executor's shard writer for `plan`: checkpoint bytes, cast (or computed by `math`), written. The
    buffer pools are made on the first shard (a run that reuses every shard allocates nothing) and kept for
    the rest, shared by shards written side by side: the one budget whatever runs at once."""
    pools: list[PoolPair] = []
    made = threading.Lock()  # shards written side by side: one pool, made once
    depth, limit = pool_plan(plan, plan_threads(plan))
    # no more threads than buffers: at most that many chunks are in flight, and each keeps a cast block
    threads = min(max(plan_threads(plan), plan.depth) if plan.remote else plan_threads(plan), depth)

    files = SharedPool(*plan.sources)  # the rank files, opened once for the shards in flight

    def write(index: int, fd: int, cancel: threading.Event, fsync: bool) -> Iterator[tuple[int, str]]:
        with made:
            if not pools:
                pools.append(make_pools(plan, depth, limit))
        return write_shard(plan, index, fd, cancel, fsync, pools[0], threads, limit, math, files=files)

    return write


def write_shard(
    plan: ConversionPlan,
    index: int,
    fd: int,
    cancel: threading.Event,
    fsync: bool,
    pools: PoolPair,
    workers: int = 1,
    limit: int | None = None,
    math: ChunkMath | None = None,
    *,
    files: SharedPool,
) -> Iterator[tuple[int, str]]:
    """Fill one shard's open file: header, then every chunk read, cast and written by `workers` threads
    (`shard_streamer` chooses them), its files read through `files` (the plan's shards' one pool). Yields
    (bytes, tensor) about 10 times a second."""
    shard = plan.shards[index]
    limit = limit or plan.chunk_limit
    threads = max(1, workers)
    io = _ShardIO(fd, cancel, pools, files.enter(), math=math)
    ex = ThreadPoolExecutor(threads, thread_name_prefix="zi-convert")
    producer = threading.Thread(
        target=_produce, args=(io, plan, index, limit, ex), name="zi-chunks", daemon=True
    )
    try:
        _allocate(fd, shard)
        producer.start()
        reported = 0
        while producer.is_alive():
            producer.join(0.1)
            if cancel.is_set():
                io.stop.set()
            with io.lock:
                delta, reported, current = io.written - reported, io.written, io.tensor
            if delta and not io.stop.is_set():
                yield delta, current
        ex.shutdown(wait=True)  # the last chunks' writes
        if io.errors:
            raise io.errors[0]
        if cancel.is_set():
            raise CancelledError("Conversion cancelled; partial files were removed.")
        if fsync:
            os.fsync(fd)
        yield io.written - reported, io.tensor
    finally:  # an OSError goes up as it is: the engine names the folder and the free space
        io.stop.set()
        if producer.is_alive():
            producer.join()
        ex.shutdown(wait=True)
        files.leave()
