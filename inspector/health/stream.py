"""Read every selected tensor once, from exactly its bytes, on a small thread pool with fixed buffers.

A job is one tensor's master (with its 16-bit module copy and, with `against`, the other tag's master read
in step, chunk for chunk), one Adam moment (with `against`, the other tag's same moment, for its norm), one
frozen parameter or one buffer. Each worker thread owns one set of chunk buffers for its whole life, so
memory is one budget (SCRATCH_BUDGET) divided among the workers, whatever the model or their number.
"""

from __future__ import annotations

import math
import queue
import threading
from collections import Counter, deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from inspector.convert.cast import cast_into
from inspector.convert.reader import FilePool, bytes_by_file, iter_chunks
from inspector.errors import CancelledError
from inspector.format.dtypes import numpy_dtype
from inspector.health.differences import max_abs_difference
from inspector.health.jobs import Job, Row, plan_jobs
from inspector.health.numerics import (
    EXACT_BLOCK,
    GROUP,
    Accumulator,
    Array,
    Buffers,
    exact_blocks,
    group_sums,
    groups,
    widened,
)
from inspector.scan.model import Segment
from inspector.system.limits import usable_cores, workers

MIN_CHUNK = GROUP  # 1 MiB of fp32: a worker's numpy calls are long enough that the interpreter between them
# is noise (the GIL is held a few microseconds per call, released for the whole block)
CHUNK_ELEMS = 4 * GROUP  # the most one worker reads at once (4 MiB of fp32; 8 MiB cost 10 % more CPU here:
# the passes after the read no longer find the chunk in the cache)
SCRATCH_BUDGET = 64 << 20  # all workers' buffers together, whatever their number: one budget, divided
SCRATCH_PER_ELEM = 14  # bytes a worker touches per chunk element, at most: the raw master 4 and module 2,
# the widened module (4), the shifted values, change or mask (4); `--against` adds its master (4)
AGAINST_PER_ELEM = 4
SCRATCH_FIXED = 5 * EXACT_BLOCK * 8  # the float64 blocks of the slow comparisons and a cast block
READ_AHEAD = 1  # chunks per stream asked of the kernel ahead of a cold pass's reads. Health of the 200M
# ZeRO-2 demo from dropped pages, 2 workers, 8 alternating pairs: 1.40 s against 1.62 s (median; every pair
# faster, 0.71-0.96x). Two or four ahead were no better (3 runs each); a warm pass asked it only lost (5 %)
_F32 = np.dtype(np.float32)
_BF16 = numpy_dtype("bfloat16")
_PLAIN_CAST = (_BF16, np.dtype(np.float16), _F32)  # numpy's cast of finite fp32 is torch's


def max_threads(against: bool = False) -> int:
    """The most workers SCRATCH_BUDGET holds at MIN_CHUNK each; more asked for run as this many."""
    return max(1, SCRATCH_BUDGET // _worker_bytes(MIN_CHUNK, against))


def _worker_bytes(chunk: int, against: bool) -> int:
    return chunk * (SCRATCH_PER_ELEM + (AGAINST_PER_ELEM if against else 0)) + SCRATCH_FIXED


def read_ahead(pool: FilePool, jobs: Sequence[Job]) -> int:
    """Chunks of each stream to ask the kernel for ahead of their reads: READ_AHEAD when most of what the
    pass reads is not in the page cache (`FilePool.mostly_cold`), else none (advice on cached pages only
    costs: 5 % of a warm pass here). From an object store the workers' own requests are in flight already."""
    return READ_AHEAD if pool.mostly_cold(job_reads(jobs)) else 0


def job_reads(jobs: Sequence[Job]) -> Counter[str]:
    """Bytes the pass reads from each file: the masters or moments, module copies and `against`'s."""
    return bytes_by_file(seg for j in jobs for seg in (*j.segments, *j.module, *j.against))


@dataclass(frozen=True)
class WorkerPlan:
    """How a pass is spread: `threads` jobs in progress at once (`busy_threads`: locally no more than the
    usable cores, from an object store as many as asked) and `chunk` elements each, the budget divided among
    them, a power-of-two multiple of MIN_CHUNK so the figures' groups never move."""

    threads: int
    chunk: int


def plan_workers(asked: int | None = None, against: bool = False, remote: bool = False) -> WorkerPlan:
    """The plan for `asked` workers (None: the one rule's default, `limits.workers`): threads up to what the
    cores and the budget allow, the budget divided among them (at most CHUNK_ELEMS), so that 2, 16 or 96
    workers cost the same memory and read the same streams in the same groups."""
    threads = max(1, min(workers(asked, remote), max_threads(against)))
    chunk = CHUNK_ELEMS
    while chunk > MIN_CHUNK and threads * _worker_bytes(chunk, against) > SCRATCH_BUDGET:
        chunk //= 2
    return WorkerPlan(threads, chunk)


class Scratch:
    """One worker thread's buffers, allocated once (pages are touched only as far as a chunk's dtype needs):
    raw bytes for up to three streams read in step, the reductions' buffers (whose shifted values also hold
    `--against`'s change and the module check's bit differences: the chunk's reductions are done by then),
    and EXACT_BLOCK float64 values and a cast block for the slow comparisons (the module copy's,
    `--against`'s)."""

    def __init__(self, chunk: int) -> None:
        self.chunk = chunk
        self.raw = [np.empty(chunk * 8, np.uint8) for _ in range(3)]
        self.buf = Buffers(chunk)
        exact = min(chunk, EXACT_BLOCK)
        self.f64 = [np.empty(exact, np.float64) for _ in range(2)]
        self.tmp = np.empty(exact, np.float64)
        self.cast = np.empty(exact * 8, np.uint8)


class Streamer:
    """Runs jobs with shared descriptors and a shared byte counter; `cancel` stops every job at its next
    chunk."""

    def __init__(
        self, pool: FilePool, cancel: threading.Event, chunk: int = CHUNK_ELEMS, ahead: int = 0
    ) -> None:
        self.pool = pool
        self.cancel = cancel
        self.ahead = ahead  # chunks of each stream asked of the kernel before they are read (`read_ahead`)
        self.stop = threading.Event()  # set when the consumer stops early: the pool drains fast
        self.chunk = chunk
        self.done_bytes = 0
        self._lock = threading.Lock()
        self._local = threading.local()
        # chunks reduced at once: one per usable core. From an object store more threads than cores overlap
        # their requests (locally there are no more threads than cores: `limits.busy_threads`), but reducing
        # on more threads than cores only thrashed the caches
        self._computing = threading.Semaphore(usable_cores())

    def _scratch(self) -> Scratch:
        s: Scratch | None = getattr(self._local, "scratch", None)
        if s is None:
            s = self._local.scratch = Scratch(self.chunk)
        return s

    def _ahead_of(self, chunks: Iterator[tuple[list[Segment], ...]]) -> Iterator[tuple[list[Segment], ...]]:
        """The job's chunks in order, each one's byte ranges handed to the kernel (`FilePool.advise`) `ahead`
        chunks before it is read: its disk reads then run while this worker reduces the chunks before it."""
        if not self.ahead:
            yield from chunks
            return
        window: deque[tuple[list[Segment], ...]] = deque()
        for item in chunks:
            for batch in item:
                for seg in batch:
                    self.pool.advise(seg.file, seg.offset, seg.nbytes)
            window.append(item)
            if len(window) > self.ahead:
                yield window.popleft()
        yield from window

    def _read(
        self, batches: Sequence[list[Segment]], raws: list[Array], dtypes: list[np.dtype[Any]]
    ) -> list[Array]:
        """Read one chunk of each stream read in step (into `raws`, as one set of runs: from an object store
        they are in flight together); returns them viewed as their stored dtypes."""
        runs: list[tuple[str, int, memoryview]] = []
        arrays: list[Array] = []
        for batch, raw, dtype in zip(batches, raws, dtypes, strict=True):
            view = memoryview(raw)  # type: ignore[arg-type]  # numpy arrays are buffers
            pos = 0
            for seg in batch:
                runs.append((seg.file, seg.offset, view[pos : pos + seg.nbytes]))
                pos += seg.nbytes
            arrays.append(raw[:pos].view(dtype))
        self.pool.read_runs(runs)
        with self._lock:
            self.done_bytes += sum(len(r[2]) for r in runs)
        return arrays

    def run(self, job: Job) -> list[Row]:
        s = self._scratch()
        row_len = int(np.prod(job.shape[1:])) if job.zero_rows and len(job.shape) >= 2 else 0
        acc = Accumulator(row_len)
        mod_acc = Accumulator() if job.module else None
        diff, differing = 0.0, 0
        delta_sq = then_sq = 0.0  # summed group by group, in stream order
        then_bad = 0
        dtypes = [numpy_dtype(job.segments[0].dtype) if job.segments else np.dtype(np.float32)]
        streams = [iter_chunks(job.segments, self.chunk)]
        if job.module:
            streams.append(iter_chunks(job.module, self.chunk))
            dtypes.append(numpy_dtype(job.module[0].dtype))
        if job.against:
            streams.append(iter_chunks(job.against, self.chunk))
            dtypes.append(numpy_dtype(job.against[0].dtype))
        raws = s.raw[: len(streams)]
        for batches in self._ahead_of(zip(*streams, strict=True)):
            if self.cancel.is_set() or self.stop.is_set():
                raise CancelledError("Health check cancelled.")
            chunks = self._read(batches, raws, dtypes)
            with self._computing:
                x = chunks[0]
                finite = acc.add(x, s.buf)
                if mod_acc is not None:
                    copy = chunks[1]
                    bf16 = finite and x.dtype == _F32 and copy.dtype == _BF16  # the common case
                    wide = widened(copy, s.buf) if bf16 else None  # into s.buf.wide once, for both
                    exact = wide is not None and _rounds_to(x, copy, s.buf)
                    # a copy that is its master rounded has the master's bounds rounded: two passes fewer
                    mod_acc.add(
                        copy if wide is None else wide, s.buf, _rounded_bounds(acc.last) if exact else None
                    )
                    if not exact:  # (any other copy is left widened in s.buf.wide by its statistics)
                        d, c = self._module_diff(x, copy, s, finite, inexact=bf16)
                        diff, differing = max(diff, d), differing + c
                if job.against:
                    o = chunks[-1]
                    if job.source == "master":
                        for v in _delta_sq(x, o, s):
                            delta_sq += v
                        then_bad += _nonfinite(o)
                    else:  # a moment: only its size then (NaN there stays NaN)
                        for v in _sum_sq(o, s):
                            then_sq += v
        dtype = job.segments[0].dtype if job.segments else "float32"
        delta = _sqrt(delta_sq) if job.against and job.source == "master" else None
        then = _sqrt(then_sq) if job.against and job.source != "master" else None
        bad = then_bad if job.against and job.source == "master" else None
        rows = [
            Row(
                job.name,
                job.source,
                job.shape,
                dtype,
                acc.result(),
                delta_norm=delta,
                against_norm=then,
                against_nonfinite=bad,
            )
        ]
        if mod_acc is not None:
            rows.append(
                Row(job.name, "module", job.shape, job.module[0].dtype, mod_acc.result(), diff, differing)
            )
        return rows

    @staticmethod
    def _module_diff(
        master: Array, module: Array, s: Scratch, finite: bool, inexact: bool = False
    ) -> tuple[float, int]:
        """(largest difference, differing elements) of the module copy from the master cast to its dtype,
        as DeepSpeed casts it after each step (bit-exact torch rounding, convert/cast.py).

        A finite fp32 master with a bf16 copy (the common case) is checked whole without a cast, in integer
        ufuncs that release the GIL (ml_dtypes' casts hold it: numpy runs legacy user casts with the Python
        API): the copy widened (s.buf.wide, from its statistics) is the master rounded to nearest even
        exactly when their bits, as int32, differ by less than 0x8000 everywhere, or by exactly 0x8000 (a
        tie) where the copy's last bit is even. Other chunks are cast whole (numpy's rounding of finite
        fp32 is torch's) into free scratch and their bits compared; only blocks that differ, and chunks
        holding NaN (whose bits need torch's fix-ups), go block by block through float64 copies. `inexact`:
        the check without a cast has already failed."""
        n = master.shape[0]
        size = module.dtype.itemsize
        uint = np.dtype(f"u{size}") if size in (2, 4, 8) else None
        plain = finite and master.dtype == _F32 and module.dtype in _PLAIN_CAST and uint is not None
        if plain and module.dtype == _BF16 and not inexact and _rounds_to(master, module, s.buf):
            return 0.0, 0
        whole: Array | None = None
        if plain and uint is not None:
            whole = s.buf.shifted[:n].view(np.uint8)[: n * size].view(module.dtype)
            np.copyto(whole, master, casting="unsafe")
            differs = s.buf.wide[:n].view(np.bool_)[:n]
            np.not_equal(whole.view(uint), module.view(uint), out=differs)
            if not differs.any():
                return 0.0, 0
        worst, differing = 0.0, 0
        for i in range(0, n, EXACT_BLOCK):
            x, m = master[i : i + EXACT_BLOCK], module[i : i + EXACT_BLOCK]
            k = m.shape[0]
            if whole is not None:
                c = whole[i : i + k]
            else:
                c = s.cast[: k * size].view(module.dtype)
                cast_into(x, c, threads=1)
            # same bits, same values (NaN payloads aside, which the float64 comparison takes)
            if uint is not None and np.array_equal(c.view(uint), m.view(uint)):
                continue
            a, b = s.f64[0][:k], s.f64[1][:k]
            np.copyto(a, m, casting="unsafe")
            np.copyto(b, c, casting="unsafe")
            d, count = max_abs_difference(a, b, s.tmp)
            worst, differing = max(worst, d), differing + count
        return worst, differing


def _rounded_bounds(bounds: tuple[float, float] | None) -> tuple[float, float] | None:
    """A finite fp32 chunk's (min, max) rounded to bf16 (to nearest even, as the copy is): the copy's own
    (min, max) exactly where the copy is that chunk rounded, rounding being monotone. None where either
    rounds to Inf, or to zero (whose sign the copy's own minimum would choose)."""
    if bounds is None:
        return None
    out = []
    for v in bounds:
        bits = int(np.float32(v).view(np.uint32))
        bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
        r = float(np.uint32(bits).view(np.float32))
        if not math.isfinite(r) or r == 0.0:
            return None
        out.append(r)
    return out[0], out[1]


def _rounds_to(master: Array, module: Array, buf: Buffers) -> bool:
    """Whether a bf16 chunk is its finite fp32 master rounded to nearest even, bit for bit (buf.wide holds
    the copy widened; buf.shifted is free). Three integer passes (two more where the chunk holds a tie), no
    cast."""
    n = master.shape[0]
    d = buf.shifted[:n].view(np.int32)
    np.subtract(master.view(np.int32), buf.wide[:n].view(np.int32), out=d)  # a sign change wraps far off
    np.abs(d, out=d)  # -2**31 stays -2**31: as uint32 it is 2**31, above every bound
    top = int(np.maximum.reduce(d.view(np.uint32)))  # one pass: no minimum needed for the wrapped case
    if top != 0x8000:
        return top < 0x8000
    ties = np.flatnonzero(d == 0x8000)  # about 4 a MiB in real masters
    return not bool(np.any(module.view(np.uint16)[ties] & 1))


def _delta_sq(x: Array, o: Array, s: Scratch) -> list[float]:
    """Σ(x - o)² of each GROUP of one chunk of two masters: for fp32 the difference in float32 (exact where
    the two are within a factor 2 of each other, else rounded once) summed as `group_sums` does; float64
    for other dtypes and for a group where float32 overflows. A NaN or Inf left as it was is no change; one
    that appeared is NaN or Inf."""
    n = x.shape[0]
    fast: list[float] = []
    if x.dtype == _F32 and o.dtype == _F32:
        d = s.buf.shifted[:n]  # free: this chunk's reductions are folded in already
        with np.errstate(all="ignore"):
            np.subtract(x, o, out=d)
        fast = group_sums(d, s.buf, linear=False)[1]
    out = []
    for g, (i, j) in enumerate(groups(n)):
        if fast and math.isfinite(fast[g]):
            out.append(fast[g])
            continue
        total = 0.0
        for xs, os_ in exact_blocks(x[i:j], o[i:j]):
            t = s.tmp[: xs.shape[0]]
            with np.errstate(invalid="ignore"):
                np.subtract(xs, os_, out=t, dtype=np.float64)  # exact for fp32 inputs
            if not math.isfinite(float(np.einsum("i,i->", t, t))):  # unchanged is no change, NaN or Inf
                t[(xs == os_) | (np.isnan(xs) & np.isnan(os_))] = 0.0
            total += float(np.einsum("i,i->", t, t))
        out.append(total)
    return out


def _nonfinite(x: Array) -> int:
    """NaN and Inf in one chunk: two reductions (min and max show either), a count only where one is."""
    if x.dtype.kind != "f" and x.dtype not in _PLAIN_CAST:
        return 0
    with np.errstate(invalid="ignore"):
        lo, hi = float(np.minimum.reduce(x)), float(np.maximum.reduce(x))
    if math.isfinite(lo) and math.isfinite(hi):
        return 0
    return int(x.shape[0] - np.count_nonzero(np.isfinite(x)))


def _sum_sq(x: Array, s: Scratch) -> list[float]:
    """Σx² of each GROUP of one chunk (fp32 group sums; float64 where they overflow or for other dtypes)."""
    fast = group_sums(x, s.buf, linear=False)[1] if x.dtype == _F32 else []
    out = []
    for g, (i, j) in enumerate(groups(x.shape[0])):
        if fast and math.isfinite(fast[g]):
            out.append(fast[g])
            continue
        total = 0.0
        for (xs,) in exact_blocks(x[i:j]):
            t = s.tmp[: xs.shape[0]]
            np.copyto(t, xs, casting="unsafe")
            total += float(np.einsum("i,i->", t, t))
        out.append(total)
    return out


def _sqrt(v: float) -> float:
    return float(np.sqrt(v))


def run_jobs(
    jobs: Sequence[Job], streamer: Streamer, threads: int, tick: float = 0.25
) -> Iterator[tuple[Job, list[Row] | BaseException] | None]:
    """Run jobs on `threads` workers, largest first; yield (job, rows or its error) as each finishes and
    None every `tick` seconds in between (for progress). Each job is handed back once, as it ends (waiting
    on every pending future each time cost O(jobs²) lock round trips: 0.3 s of the main thread's time on
    249 jobs under a profiler). Leaving the loop early stops the other jobs at their next chunk."""
    from concurrent.futures import Future, ThreadPoolExecutor

    order = sorted(jobs, key=lambda j: -j.nbytes)
    ended: queue.SimpleQueue[Future[list[Row]]] = queue.SimpleQueue()
    with ThreadPoolExecutor(threads, thread_name_prefix="zi-health") as ex:
        futures: dict[Future[list[Row]], Job] = {}
        for j in order:
            f = ex.submit(streamer.run, j)
            futures[f] = j
            f.add_done_callback(ended.put)
        left = len(futures)
        try:
            while left:
                try:
                    f = ended.get(timeout=tick)
                except queue.Empty:
                    yield None
                    continue
                left -= 1
                exc = f.exception()
                yield futures[f], (exc if exc is not None else f.result())
        finally:
            if left:
                streamer.stop.set()
                for f in futures:
                    f.cancel()


__all__ = [  # the jobs are planned in jobs.py; the pass's callers take them from here, with the workers
    "Job",
    "Row",
    "Streamer",
    "WorkerPlan",
    "plan_jobs",
    "plan_workers",
    "run_jobs",
]
