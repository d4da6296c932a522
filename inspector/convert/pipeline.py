"""Write one shard through three overlapping stages, with memory fixed by the buffer pools.

A reader thread fills source buffers with positioned reads, the calling thread casts dtypes with numpy +
ml_dtypes (bit-identical to torch's `.to(dtype)`, split over cores; see cast.py), a writer thread `pwrite`s
the result at its planned offset. Tensors that need no cast never enter Python buffers: the reader copies
them file to file in the kernel (`os.copy_file_range`, falling back to the buffers where the file systems
refuse). Buffers come from fixed pools allocated once per run, so peak memory is PIPELINE_DEPTH chunks per
stage whatever the model, shard or tensor size (from an object store 8 chunks a quarter the size: more round
trips in flight in fewer bytes; `plan.depth`).

This is the part of a conversion that moves bytes; `engine` decides which shards to write and owns
everything around them (output folder, journal, renames, progress events, cancel).
"""

from __future__ import annotations

import errno
import os
import queue
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np

from inspector.convert.cast import cast_into, typed
from inspector.convert.plan import ConversionPlan, PlannedShard, PlannedTensor
from inspector.convert.reader import FilePool, buffer, byte_view, iter_chunks, read_segments_into
from inspector.errors import CancelledError
from inspector.format.dtypes import itemsize
from inspector.scan.model import Segment


@dataclass
class _Chunk:
    """One slice of a tensor on its way from the reader through the cast to the writer."""

    shard: int
    tensor: PlannedTensor
    file_offset: int  # absolute offset in the shard file
    numel: int
    src: np.ndarray | None = None  # uint8 buffer holding source bytes
    out: np.ndarray | None = None
    copied: bool = False  # already copied file to file by the reader; only to be counted
    pending: Future[int] | None = None  # the read still filling `src` (sources on an object store)


PoolPair = tuple["queue.Queue[np.ndarray]", "queue.Queue[np.ndarray]"]  # (source, output) buffers


def _get(q: queue.Queue[_Chunk | None], stop: threading.Event) -> _Chunk | None:
    while True:
        try:
            return q.get(timeout=0.1)
        except queue.Empty:
            if stop.is_set():
                return None


def _put(q: queue.Queue[_Chunk | None], item: _Chunk | None, stop: threading.Event) -> bool:
    while not stop.is_set():
        try:
            q.put(item, timeout=0.1)
            return True
        except queue.Full:
            continue
    return False


def _take(pool: queue.Queue[np.ndarray], stop: threading.Event) -> np.ndarray | None:
    while not stop.is_set():
        try:
            return pool.get(timeout=0.1)
        except queue.Empty:
            continue
    return None


def _pwrite_all(fd: int, data: memoryview, offset: int) -> None:
    while data:
        n = os.pwrite(fd, data, offset)
        data = data[n:]
        offset += n


def make_pools(plan: ConversionPlan) -> PoolPair:
    """The run's whole memory budget: `plan.depth` source and output buffers, allocated once."""
    src_bytes, out_bytes = plan.pool_sizes
    src_pool: queue.Queue[np.ndarray] = queue.Queue()
    out_pool: queue.Queue[np.ndarray] = queue.Queue()
    for _ in range(plan.depth):
        src_pool.put(buffer(src_bytes))
        if out_bytes:
            out_pool.put(buffer(out_bytes))
    return src_pool, out_pool


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


def _kernel_copy(kernel: _KernelCopy, pool: FilePool, fd: int, segs: list[Segment], pos: int) -> bool:
    """Copy a no-cast chunk in the kernel; False: the buffered path must (re)write the whole chunk."""
    for seg in segs:
        src = pool.fd(seg.file)
        if src is None or not kernel.copy(src, seg.offset, fd, pos, seg.nbytes):  # None: a remote object
            return False
        pos += seg.nbytes
    return True


@dataclass
class _ShardIO:
    """What the reader, converter and writer of one shard share."""

    index: int
    shard: PlannedShard
    fd: int
    cancel: threading.Event
    src_pool: queue.Queue[np.ndarray]
    out_pool: queue.Queue[np.ndarray]
    depth: int  # chunks in flight per stage (plan.depth)
    read_q: queue.Queue[_Chunk | None] = field(init=False)
    write_q: queue.Queue[_Chunk | None] = field(init=False)
    stop: threading.Event = field(default_factory=threading.Event)
    errors: list[BaseException] = field(default_factory=list)
    written: list[int] = field(default_factory=lambda: [0])
    lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        self.read_q = queue.Queue(maxsize=self.depth)
        self.write_q = queue.Queue(maxsize=self.depth)


def _reader(io: _ShardIO, limit: int, pool: FilePool, kernel: _KernelCopy) -> None:
    """Reader thread: queue each chunk's source bytes (or a kernel-copied marker) in file order.

    From an object store a chunk's read is a round trip: it is started and queued at once, so up to
    `depth` chunks (the source buffers there are) are in flight while earlier ones are cast and
    written; the consumer waits for each in order. Local reads stay synchronous (pread is not a round trip)."""
    shard, index, stop, read_q, cancel = io.shard, io.index, io.stop, io.read_q, io.cancel
    base = len(shard.header)
    ahead = ThreadPoolExecutor(io.depth, thread_name_prefix="zi-read") if pool.remote else None
    try:
        for t in shard.tensors:
            pos = base + t.offset
            osz = itemsize(t.out_dtype)
            for segs in iter_chunks(t.segments, shard.chunk_elems(t, limit)):
                if cancel.is_set() or stop.is_set():
                    return
                n = sum(s.numel for s in segs)
                if t.src_dtype == t.out_dtype and _kernel_copy(kernel, pool, io.fd, segs, pos):
                    if not _put(read_q, _Chunk(index, t, pos, n, copied=True), stop):
                        return
                    pos += n * osz
                    continue
                buf = _take(io.src_pool, stop)
                if buf is None or cancel.is_set():
                    return
                chunk = _Chunk(index, t, pos, n, src=buf)
                if ahead is not None:
                    chunk.pending = ahead.submit(read_segments_into, pool, segs, buf)
                else:
                    read_segments_into(pool, segs, buf)
                if not _put(read_q, chunk, stop):
                    return
                pos += n * osz
    except BaseException as exc:
        io.errors.append(exc)
        stop.set()
    finally:
        _put(read_q, None, stop)
        if ahead is not None:  # no read may fill a buffer after the shard is done with it
            ahead.shutdown(wait=True)


def _writer(io: _ShardIO) -> None:
    """Writer thread: write each converted chunk at its offset and return its buffer to its pool."""
    try:
        while (c := _get(io.write_q, io.stop)) is not None:
            nbytes = c.numel * itemsize(c.tensor.out_dtype)
            if not c.copied:
                assert c.out is not None
                _pwrite_all(io.fd, byte_view(c.out)[:nbytes], c.file_offset)
                (io.src_pool if c.out is c.src else io.out_pool).put(c.out)
            with io.lock:
                io.written[0] += nbytes
    except BaseException as exc:
        io.errors.append(exc)
        io.stop.set()


def _allocate(fd: int, shard: PlannedShard) -> None:
    """Reserve the shard's whole size and write its header."""
    try:
        os.posix_fallocate(fd, 0, shard.file_bytes)
    except OSError as exc:
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            raise
        os.ftruncate(fd, shard.file_bytes)  # file system without fallocate
    _pwrite_all(fd, memoryview(shard.header), 0)


def _convert(io: _ShardIO, c: _Chunk) -> bool:
    """Give `c` its output buffer (casting if needed); False when stopped while waiting for a buffer."""
    t = c.tensor
    if c.copied:
        pass
    elif t.src_dtype == t.out_dtype:
        c.out = c.src
    else:
        assert c.src is not None
        out = _take(io.out_pool, io.stop)
        if out is None:
            return False
        cast_into(typed(c.src, t.src_dtype, c.numel), typed(out, t.out_dtype, c.numel))
        c.out = out
        io.src_pool.put(c.src)
    return True


def shard_streamer(
    plan: ConversionPlan,
) -> Callable[[int, int, threading.Event, bool], Iterator[tuple[int, str]]]:
    """The engine's default shard writer for `plan`: checkpoint bytes, cast, written. The buffer pools are
    made on the first shard (a run that reuses every shard allocates nothing) and kept for the rest."""
    pools: list[PoolPair] = []

    def write(index: int, fd: int, cancel: threading.Event, fsync: bool) -> Iterator[tuple[int, str]]:
        if not pools:
            pools.append(make_pools(plan))
        return write_shard(plan, index, fd, cancel, fsync, pools[0])

    return write


def write_shard(
    plan: ConversionPlan,
    index: int,
    fd: int,
    cancel: threading.Event,
    fsync: bool,
    pools: PoolPair,
) -> Iterator[tuple[int, str]]:
    """Fill one shard's open file: header, then every tensor through read -> convert -> write. Yields
    (bytes, tensor)."""
    shard = plan.shards[index]
    limit = plan.chunk_limit
    src_pool, out_pool = pools
    io = _ShardIO(index, shard, fd, cancel, src_pool, out_pool, plan.depth)
    stop, errors, written, lock = io.stop, io.errors, io.written, io.lock
    pool = FilePool(*plan.sources)
    kernel = _KernelCopy()
    threads = [
        threading.Thread(target=_reader, args=(io, limit, pool, kernel), name="zi-reader", daemon=True),
        threading.Thread(target=_writer, args=(io,), name="zi-writer", daemon=True),
    ]
    try:
        _allocate(fd, shard)
        for th in threads:
            th.start()
        reported = 0
        current = ""
        while (c := _get(io.read_q, stop)) is not None:
            if cancel.is_set():
                stop.set()
                break
            if c.pending is not None and (exc := c.pending.exception()) is not None:
                errors.append(exc)
                stop.set()
                break
            if not _convert(io, c):
                break
            if not _put(io.write_q, c, stop):
                break
            current = c.tensor.name
            with lock:
                delta, reported = written[0] - reported, written[0]
            if delta:
                yield delta, current
        _put(io.write_q, None, stop)
        for th in threads:
            th.join()
        if errors:
            raise errors[0]
        if cancel.is_set():
            raise CancelledError("Conversion cancelled; partial files were removed.")
        if fsync:
            os.fsync(fd)
        yield written[0] - reported, current
    finally:  # an OSError goes up as it is: the engine names the folder and the free space
        stop.set()
        for th in threads:
            if th.is_alive():
                th.join()
        pool.close()
