"""Read every selected tensor once, from exactly its bytes, on a small thread pool with fixed buffers.

A job is one tensor's master (with its 16-bit module copy and, with `against`, the other tag's master read
in step, chunk for chunk), one Adam moment (with `against`, the other tag's same moment, for its norm), one
frozen parameter or one buffer. Each worker thread owns one set of chunk buffers for its whole life, so
memory is one budget (SCRATCH_BUDGET) divided among the workers, whatever the model or their number.
"""

from __future__ import annotations

import queue
import threading
from collections import deque
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from inspector.convert.reader import FilePool, iter_chunks
from inspector.convert.stripes import Stripe, fill_gaps, gather_one, stripe_reads
from inspector.errors import CancelledError
from inspector.format.dtypes import bits_dtype
from inspector.health.chunk_math import (
    BF16,
    F32,
    Scratch,
    delta_sq,
    module_diff,
    nonfinite,
    rounded_bounds,
    rounds_to,
    sqrt,
    sum_sq,
)
from inspector.health.jobs import Job, Row, plan_jobs
from inspector.health.numerics import (
    EXACT_BLOCK,
    GROUP,
    Accumulator,
    Array,
    widened,
)
from inspector.health.units import Unit, jobs_of, parts, plan_units, unit_reads
from inspector.scan.model import Segment
from inspector.system.limits import LOCAL_THREADS, gil_enabled, usable_cores, workers

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
def max_threads(against: bool = False) -> int:
    """The most workers SCRATCH_BUDGET holds at MIN_CHUNK each; more asked for run as this many."""
    return max(1, SCRATCH_BUDGET // _worker_bytes(MIN_CHUNK, against))


def _worker_bytes(chunk: int, against: bool) -> int:
    return chunk * (SCRATCH_PER_ELEM + (AGAINST_PER_ELEM if against else 0)) + SCRATCH_FIXED


def read_ahead(pool: FilePool, units: Sequence[Unit], by_file: Mapping[str, int] | None = None) -> int:
    """Chunks of each stream to ask the kernel for ahead of their reads: READ_AHEAD when most of what the
    pass reads (`by_file`, else counted from `units`) is not in the page cache (`FilePool.mostly_cold`), else
    none (advice on cached pages only costs: 5 % of a warm pass here). From an object store the workers' own
    requests are in flight already."""
    return READ_AHEAD if pool.mostly_cold(by_file if by_file is not None else unit_reads(units)[0]) else 0


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
        # chunks reduced at once: one per usable core, at most LOCAL_THREADS under the GIL (`limits.workers`
        # holds local threads to the same). From an object store more threads overlap their requests, but
        # reducing on more threads than cores only thrashed the caches, and past the ceiling their numpy
        # calls' GIL handoffs are the pass (measured locally; from a store not measured)
        cores = usable_cores()
        self._computing = threading.Semaphore(min(cores, LOCAL_THREADS) if gil_enabled() else cores)

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
        self, batches: Sequence[Sequence[Segment]], raws: list[Array], dtypes: list[np.dtype[Any]]
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

    def run(self, unit: Unit) -> list[Row]:
        """One job's rows (a stripe's: each of its jobs'): its streams read in step, chunk by chunk, each
        chunk reduced as it arrives."""
        if isinstance(unit, Stripe):
            return self._run_stripe(unit)
        job = unit
        s = self._scratch()
        row_len = int(np.prod(job.shape[1:])) if job.zero_rows and len(job.shape) >= 2 else 0
        t = _Tally(Accumulator(row_len), Accumulator() if job.module else None)
        dtypes = [bits_dtype(job.segments[0].dtype) if job.segments else np.dtype(np.float32)]
        streams = [iter_chunks(job.segments, self.chunk)]
        if job.module:
            streams.append(iter_chunks(job.module, self.chunk))
            dtypes.append(bits_dtype(job.module[0].dtype))
        if job.against:
            streams.append(iter_chunks(job.against, self.chunk))
            dtypes.append(bits_dtype(job.against[0].dtype))
        raws = s.raw[: len(streams)]
        for batches in self._ahead_of(zip(*streams, strict=True)):
            if self.cancel.is_set() or self.stop.is_set():
                raise CancelledError("Health check cancelled.")
            chunks = self._read(batches, raws, dtypes)
            with self._computing:
                _reduce(job, chunks, s, t)
        return _rows(job, t)

    def _run_stripe(self, st: Stripe[Job]) -> list[Row]:
        """A stripe's rows (`units.py`): a window of every rank read once into the first raw buffer, then
        each job's elements (and `--against`'s) gathered into the next ones and reduced in the pieces its
        own chunks would have been."""
        s = self._scratch()
        if self.cancel.is_set() or self.stop.is_set():
            raise CancelledError("Health check cancelled.")
        raw = s.raw[0]
        view = memoryview(raw)  # type: ignore[arg-type]  # numpy arrays are buffers
        reads = stripe_reads(st)
        if self.ahead:  # from a cold cache: every rank's window asked at once, the disk reads them together
            for f, off, _, n in reads:
                self.pool.advise(f, off, n)
        self.pool.read_runs([(f, off, view[at : at + n]) for f, off, at, n in reads])
        with self._lock:
            self.done_bytes += sum(r[3] for r in reads)
        fill_gaps(st, raw)
        dtype = bits_dtype(st.windows[0].starts.dtype)
        rows = raw[: st.rows * dtype.itemsize].view(dtype)
        out: list[Row] = []
        for job in st.tensors:
            slices = parts(job) or ()
            arrays = []
            for part, dst in zip(slices, s.raw[1:], strict=False):
                arrays.append(dst[: part.numel * dtype.itemsize].view(dtype))
                gather_one(st, rows, part, arrays[-1])
            row_len = int(np.prod(job.shape[1:])) if job.zero_rows and len(job.shape) >= 2 else 0
            t = _Tally(Accumulator(row_len), None)
            for i in range(0, job.numel, self.chunk):
                if self.cancel.is_set() or self.stop.is_set():
                    raise CancelledError("Health check cancelled.")
                with self._computing:
                    _reduce(job, [a[i : i + self.chunk] for a in arrays], s, t)
            out.extend(_rows(job, t))
        return out


@dataclass
class _Tally:
    """What one job's chunks add up to, in stream order: the statistics of the stream (and of the module
    copy), the module's differences, and with `against` the change's (or the moment's) squares."""

    acc: Accumulator
    mod_acc: Accumulator | None
    diff: float = 0.0
    differing: int = 0
    delta_sq: float = 0.0  # summed group by group, in stream order
    then_sq: float = 0.0
    then_bad: int = 0


def _reduce(job: Job, chunks: list[Array], s: Scratch, t: _Tally) -> None:
    """Fold one chunk of each stream into the tally: the master's last, as the module check may leave the
    master's bytes spent (`rounds_to`)."""
    x = chunks[0]
    finite = t.acc.add(x, s.buf)
    if job.against:
        o = chunks[-1]
        if job.source == "master":
            for v in delta_sq(x, o, s):
                t.delta_sq += v
            t.then_bad += nonfinite(o)
        else:  # a moment: only its size then (NaN there stays NaN)
            for v in sum_sq(o, s):
                t.then_sq += v
    if t.mod_acc is not None:
        copy = chunks[1]
        bf16 = finite and x.dtype == F32 and copy.dtype == BF16  # the common case
        wide = widened(copy, s.buf) if bf16 else None  # into s.buf.wide once, for both
        exact = wide is not None and rounds_to(x, copy, s.buf)
        # a copy that is its master rounded has the master's bounds rounded: two passes fewer
        t.mod_acc.add(copy if wide is None else wide, s.buf, rounded_bounds(t.acc.last) if exact else None)
        if not exact:  # (any other copy is left widened in s.buf.wide by its statistics)
            d, c = module_diff(x, copy, s, finite, inexact=bf16)
            t.diff, t.differing = max(t.diff, d), t.differing + c


def _rows(job: Job, t: _Tally) -> list[Row]:
    """The job's row (and its module copy's), with `against`'s figures where they apply."""
    dtype = job.segments[0].dtype if job.segments else "float32"
    master = bool(job.against) and job.source == "master"
    rows = [
        Row(
            job.name,
            job.source,
            job.shape,
            dtype,
            t.acc.result(),
            delta_norm=sqrt(t.delta_sq) if master else None,
            against_norm=sqrt(t.then_sq) if job.against and job.source != "master" else None,
            against_nonfinite=t.then_bad if master else None,
        )
    ]
    if t.mod_acc is not None:
        rows.append(
            Row(job.name, "module", job.shape, job.module[0].dtype, t.mod_acc.result(), t.diff, t.differing)
        )
    return rows

def run_jobs(
    jobs: Sequence[Unit], streamer: Streamer, threads: int, tick: float = 0.25
) -> Iterator[tuple[Unit, list[Row] | BaseException] | None]:
    """Run jobs on `threads` workers, largest first; yield (job, rows or its error) as each finishes and
    None every `tick` seconds in between (for progress). Each job is handed back once, as it ends (waiting
    on every pending future each time cost O(jobs²) lock round trips: 0.3 s of the main thread's time on
    249 jobs under a profiler). Leaving the loop early stops the other jobs at their next chunk."""
    from concurrent.futures import Future, ThreadPoolExecutor

    order = sorted(jobs, key=lambda j: -sum(x.nbytes for x in jobs_of(j)))
    ended: queue.SimpleQueue[Future[list[Row]]] = queue.SimpleQueue()
    with ThreadPoolExecutor(threads, thread_name_prefix="zi-health") as ex:
        futures: dict[Future[list[Row]], Unit] = {}
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
    "plan_units",
    "plan_workers",
    "run_jobs",
    "unit_reads",
]
