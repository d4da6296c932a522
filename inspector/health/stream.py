"""Read every selected tensor once, from exactly its bytes, on a small thread pool with fixed buffers.

A job is one tensor's master (with its 16-bit module copy and, with `against`, the other tag's master read
in step, chunk for chunk), one Adam moment (with `against`, the other tag's same moment, for its norm), one
frozen parameter or one buffer. Each worker thread owns one set of chunk buffers for its whole life, so
memory is `threads x` one chunk per stream whatever the model.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from inspector.convert.cast import cast_into
from inspector.convert.reader import FilePool, iter_chunks
from inspector.errors import CancelledError
from inspector.format.dtypes import numpy_dtype
from inspector.health.numerics import (
    EXACT_BLOCK,
    Accumulator,
    Array,
    Buffers,
    Stats,
    block_sums,
    exact_blocks,
    max_abs_difference,
)
from inspector.scan.model import Checkpoint, Kind, Segment, TensorInfo
from inspector.system.limits import usable_cores

CHUNK_ELEMS = 1 << 19  # 512 Ki elements: 2 MiB of fp32, still in the cache for the passes after the read;
# measured on the 2-core machine: 7 % less CPU than 256 Ki (Python's cost per chunk), 1 Mi no better
MIN_CHUNK = 1 << 16
MAX_THREADS = 16  # the memory bus, not the cores, sets the pace well before this
REMOTE_THREADS = 6  # from an object store a worker mostly waits on its requests (a master's two or three
# streams fetched together): 6 keep the store's 8 in flight; measured on S3 with --against, 8 were no faster
# and 11 MiB larger (124 against 113 MiB)
SCRATCH_BUDGET = 48 << 20  # all workers' chunk buffers together: with the interpreter, flat under 128 MiB
SCRATCH_PER_ELEM = 20  # bytes a worker touches per chunk element, at most: the raw master 4, module 2 and
# other tag's master 4, the widened (4) and shifted values or change (4), a mask (1), the cast master (2)
_F32 = np.dtype(np.float32)
_PLAIN_CAST = (numpy_dtype("bfloat16"), np.dtype(np.float16), _F32)  # numpy's cast of finite fp32 is torch's


def default_threads(remote: bool = False) -> int:
    """Every usable core (at least 2: one reads while the other reduces), up to MAX_THREADS; from an object
    store at least REMOTE_THREADS, so that many requests are in flight."""
    threads = max(2, min(MAX_THREADS, usable_cores()))
    return max(threads, REMOTE_THREADS) if remote else threads


def chunk_for(threads: int) -> int:
    """Elements per chunk for `threads` workers: CHUNK_ELEMS while their buffers fit SCRATCH_BUDGET, halved
    until they do (not below MIN_CHUNK), so more cores never mean more memory."""
    chunk = CHUNK_ELEMS
    while chunk > MIN_CHUNK and threads * chunk * SCRATCH_PER_ELEM > SCRATCH_BUDGET:
        chunk //= 2
    return chunk


@dataclass(frozen=True, slots=True)
class Job:
    """One stream to reduce (plus, for masters, the streams read in step with it)."""

    name: str
    source: str  # master | exp_avg | exp_avg_sq | frozen | buffer
    shape: tuple[int, ...]
    segments: tuple[Segment, ...]
    module: tuple[Segment, ...] = ()
    against: tuple[Segment, ...] = ()
    zero_rows: bool = False

    @property
    def nbytes(self) -> int:
        return sum(s.nbytes for s in (*self.segments, *self.module, *self.against))


@dataclass(frozen=True, slots=True)
class Row:
    """The statistics of one source of one tensor (the unit of the report's `tensors` list)."""

    name: str
    source: str
    shape: tuple[int, ...]
    dtype: str
    stats: Stats
    module_max_diff: float | None = None  # module rows: largest |module - master cast to module dtype|
    module_differing: int | None = None
    delta_norm: float | None = None  # master rows with `against`: ||master - master_against||
    against_norm: float | None = None  # moment rows with `against`: the same moment's L2 norm in that tag
    against_nonfinite: int | None = None  # master rows with `against`: NaN and Inf in that tag's master

    @property
    def module(self) -> str:
        return self.name.rpartition(".")[0]

    @property
    def delta_rel(self) -> float | None:
        """The change relative to the tensor's norm in this tag."""
        if self.delta_norm is None:
            return None
        if self.stats.norm:
            return self.delta_norm / self.stats.norm
        return 0.0 if self.delta_norm == 0 else float("inf")


def plan_jobs(ckpt: Checkpoint, tensors: Sequence[TensorInfo], against: Checkpoint | None) -> list[Job]:
    """The streams of the selected tensors. Tied aliases are read once, under their owner's name (the alias
    itself only when its owner is not selected)."""
    chosen = {t.name for t in tensors}
    jobs: list[Job] = []
    for t in tensors:
        if t.kind is Kind.TIED and t.alias_of in chosen:
            continue
        if t.kind in (Kind.TRAINABLE, Kind.TIED):
            other: tuple[Segment, ...] = ()
            o = None
            if against is not None:
                o = _by_name(against, t.alias_of if t.kind is Kind.TIED and t.alias_of else t.name)
                if o is not None and tuple(o.shape) == tuple(t.shape) and o.segments:  # (23, 70) is no (70, 23)
                    other = o.segments
            module = t.module_copy if sum(s.numel for s in t.module_copy) == t.numel else ()
            jobs.append(Job(t.name, "master", t.shape, t.segments, module, other))
            then = dict(o.moments) if other and o is not None else {}
            for moment, segs in t.moments:
                prior = then.get(moment, ())
                if sum(s.numel for s in prior) != t.numel:
                    prior = ()
                jobs.append(
                    Job(t.name, moment, t.shape, segs, against=prior, zero_rows=moment == "exp_avg_sq")
                )
        else:
            jobs.append(Job(t.name, "frozen" if t.kind is Kind.FROZEN else "buffer", t.shape, t.segments))
    return [j for j in jobs if j.segments or not j.shape]


def _by_name(ckpt: Checkpoint, name: str) -> TensorInfo | None:
    try:
        return ckpt.tensor(name)
    except KeyError:
        return None


class Scratch:
    """One worker thread's buffers, allocated once (pages are touched only as far as a chunk's dtype needs):
    raw bytes for up to three streams read in step, the reductions' buffers (whose shifted values also hold
    `--against`'s change: the chunk's reductions are done by then), the cast master, and EXACT_BLOCK float64
    values for the slow comparisons (the module copy's, `--against`'s)."""

    def __init__(self, chunk: int) -> None:
        self.chunk = chunk
        self.raw = [np.empty(chunk * 8, np.uint8) for _ in range(3)]
        self.buf = Buffers(chunk)
        exact = min(chunk, EXACT_BLOCK)
        self.f64 = [np.empty(exact, np.float64) for _ in range(2)]
        self.tmp = np.empty(exact, np.float64)
        self.cast = np.empty(chunk * 8, np.uint8)


class Streamer:
    """Runs jobs with shared descriptors and a shared byte counter; `cancel` stops every job at its next
    chunk."""

    def __init__(self, pool: FilePool, cancel: threading.Event, chunk: int = CHUNK_ELEMS) -> None:
        self.pool = pool
        self.cancel = cancel
        self.stop = threading.Event()  # set when the consumer stops early: the pool drains fast
        self.chunk = chunk
        self.done_bytes = 0
        self._lock = threading.Lock()
        self._local = threading.local()

    def _scratch(self) -> Scratch:
        s: Scratch | None = getattr(self._local, "scratch", None)
        if s is None:
            s = self._local.scratch = Scratch(self.chunk)
        return s

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
        delta_sq = then_sq = 0.0
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
        for batches in zip(*streams, strict=True):
            if self.cancel.is_set() or self.stop.is_set():
                raise CancelledError("Health check cancelled.")
            chunks = self._read(batches, raws, dtypes)
            x = chunks[0]
            finite = acc.add(x, s.buf)
            if mod_acc is not None:
                m = chunks[1]
                d, c = self._module_diff(x, m, s, finite)
                diff, differing = max(diff, d), differing + c
                mod_acc.add(m, s.buf)
            if job.against:
                o = chunks[-1]
                if job.source == "master":
                    delta_sq += self._delta_sq(x, o, s)
                    then_bad += _nonfinite(o)
                else:  # a moment: only its size then (NaN there stays NaN)
                    then_sq += _sum_sq(o, s)
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
    def _delta_sq(x: Array, o: Array, s: Scratch) -> float:
        """Σ(x - o)² of one chunk of two fp32 masters: the difference in float32 (exact where the two are
        within a factor 2 of each other, else rounded once) summed as `block_sums` does; float64 for other
        dtypes and where float32 overflows. A NaN or Inf left as it was is no change; one that appeared is
        NaN or Inf."""
        n = x.shape[0]
        if x.dtype == np.float32 and o.dtype == np.float32:
            d = s.buf.shifted[:n]  # free: this chunk's reductions are folded in already
            with np.errstate(all="ignore"):
                np.subtract(x, o, out=d)
            sq = block_sums(d, s.buf, linear=False)[1]
            if math.isfinite(sq):
                return sq
        total = 0.0
        for xs, os_ in exact_blocks(x, o):
            t = s.tmp[: xs.shape[0]]
            with np.errstate(invalid="ignore"):
                np.subtract(xs, os_, out=t, dtype=np.float64)  # exact for fp32 inputs
            if not math.isfinite(float(np.einsum("i,i->", t, t))):  # unchanged is no change, NaN or Inf
                t[(xs == os_) | (np.isnan(xs) & np.isnan(os_))] = 0.0
            total += float(np.einsum("i,i->", t, t))
        return total

    @staticmethod
    def _module_diff(master: Array, module: Array, s: Scratch, finite: bool) -> tuple[float, int]:
        """(largest difference, differing elements) of the module copy from the master cast to its dtype,
        as DeepSpeed casts it after each step (bit-exact torch rounding, convert/cast.py; a finite chunk
        needs no NaN fix-up, so numpy/ml_dtypes' own cast is that rounding)."""
        n = master.shape[0]
        size = module.dtype.itemsize
        cast = s.cast[: n * size].view(module.dtype)
        bits = np.dtype(f"u{size}") if size in (2, 4, 8) else None
        plain = finite and master.dtype == _F32 and module.dtype in _PLAIN_CAST
        if plain:  # the common case, whole chunk at once: one cast and one comparison of the bits
            np.copyto(cast, master, casting="unsafe")
            if bits is not None and np.array_equal(cast.view(bits), module.view(bits)):
                return 0.0, 0
        worst, differing = 0.0, 0
        for x, c, m in exact_blocks(master, cast, module):  # NaN fix-ups and float64 copies, block by block
            if not plain:
                cast_into(x, c, threads=1)
            # same bits, same values (NaN payloads aside, which the float64 comparison takes)
            if bits is not None and np.array_equal(c.view(bits), m.view(bits)):
                continue
            k = m.shape[0]
            a, b = s.f64[0][:k], s.f64[1][:k]
            np.copyto(a, m, casting="unsafe")
            np.copyto(b, c, casting="unsafe")
            d, count = max_abs_difference(a, b, s.tmp)
            worst, differing = max(worst, d), differing + count
        return worst, differing


def _nonfinite(x: Array) -> int:
    """NaN and Inf in one chunk: two reductions (min and max show either), a count only where one is."""
    if x.dtype.kind != "f" and x.dtype not in _PLAIN_CAST:
        return 0
    with np.errstate(invalid="ignore"):
        lo, hi = float(np.minimum.reduce(x)), float(np.maximum.reduce(x))
    if math.isfinite(lo) and math.isfinite(hi):
        return 0
    return int(x.shape[0] - np.count_nonzero(np.isfinite(x)))


def _sum_sq(x: Array, s: Scratch) -> float:
    """Σx² of one chunk (fp32 block sums; float64 where they overflow or for other dtypes)."""
    if x.dtype == _F32:
        sq = block_sums(x, s.buf, linear=False)[1]
        if math.isfinite(sq):
            return sq
    total = 0.0
    for (xs,) in exact_blocks(x):
        t = s.tmp[: xs.shape[0]]
        np.copyto(t, xs, casting="unsafe")
        total += float(np.einsum("i,i->", t, t))
    return total


def _sqrt(v: float) -> float:
    return float(np.sqrt(v))


def run_jobs(
    jobs: Sequence[Job], streamer: Streamer, threads: int, tick: float = 0.25
) -> Iterator[tuple[Job, list[Row] | BaseException] | None]:
    """Run jobs on `threads` workers, largest first; yield (job, rows or its error) as each finishes and
    None every `tick` seconds in between (for progress). Leaving the loop early stops the other jobs at
    their next chunk."""
    from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait

    order = sorted(jobs, key=lambda j: -j.nbytes)
    with ThreadPoolExecutor(threads, thread_name_prefix="zi-health") as ex:
        futures = {ex.submit(streamer.run, j): j for j in order}
        pending = set(futures)
        try:
            while pending:
                finished, pending = wait(pending, timeout=tick, return_when=FIRST_COMPLETED)
                for f in finished:
                    exc = f.exception()
                    yield futures[f], (exc if exc is not None else f.result())
                if not finished:
                    yield None
        finally:
            if pending:
                streamer.stop.set()
                for f in pending:
                    f.cancel()
