"""What this machine's CPU does now, one kind of work at a time: the probes preflight's time model
(`calibrate`) prices each cost in.

Each cost is priced in the probe that does its kind of work, because machines differ by kind, not by one
factor. On a 16-core VM (2026-12-04) a 4 MiB copy ran 3.9x slower than on the 2-core reference machine (it
fits this machine's L3 and not that one's), a pread of resident pages 2.1x, numpy's passes over 4 MiB
2.3-3.7x, a cast 1.55x, CRC-32 1.05x and plain Python 1.0-1.5x, while the runs took 1.0x (thousands of
ranks: Python) to 1.8x (health): priced in the copy probe alone, preflight said +60 to +290 % there.
So: bytes moved through memory (the page cache's reads and writes, the kernel's copies) in the read probe,
a pread of the checkpoint's own resident pages; numpy's reductions over a chunk in their own (health's
statistics: 2.2x slower there, as the runs' checks were, while the read probe said 1.1-1.8x and moved with
each checkpoint's pages here, 7.4-15.5 GB/s); CRC-32 in its own; a cast in its own;
per-read, per-file and per-job bookkeeping and start-up in a plain Python loop. Each probe is the best of a
few tries and costs at most a few milliseconds (the read probe at most READ_PROBE bytes twice)."""

from __future__ import annotations

import math
import mmap
import os
import time
import zlib
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from inspector.convert.cast import cast_raw
from inspector.convert.reader import FilePool, buffer
from inspector.format.dtypes import itemsize

CAST_ELEMS = 1 << 18
MEM_PROBE = 4 << 20  # bytes copied in memory by the copy probe (twice its size held for a millisecond)
PROBE_TRIES, PROBE_GAP = 5, 5e-3  # the probes' tries a burst, and the seconds between bursts
PAGE_PROBE = 1 << 20  # bytes of fresh anonymous memory the page probe faults in, three times
READ_PROBE = 64 << 20  # resident bytes the read probe preads a pass: past the caches (32 MiB L3 here)
READ_MIN = 8 << 20  # fewer resident bytes than this: the read rate from the copy probe's (READ_PER_COPY)
# a pread of resident pages into a 1 MiB buffer against the copy probe, where nothing resident can be read:
# 18.6-19.9 GB/s against 45-48 on the reference machine (tests/benchmarks/probes.py, 2026-12-04)
READ_PER_COPY = 0.41
CRC_PROBE = 1 << 20  # bytes the CRC-32 probe checksums
REDUCE_ELEMS = 1 << 20  # fp32 values the reduction probe passes over: health's chunk (4 MiB)
PY_LOOP = 5_000  # iterations of the Python probe's loop (~0.3 ms here)


def best(run: Callable[[], object], tries: int = PROBE_TRIES, bursts: int = 2) -> float:
    """The fastest of `tries` runs of `run`, back to back (the first warms the caches for the rest), in two
    bursts a few milliseconds apart: a probe measures what a core can do, the load (`system.cpuload`) what
    share of it the run will get. One burst of five once fell inside another process's busy moment (the copy
    probe read 7.4 GB/s where its best is 48, the prediction 2x the run); tries spread a millisecond apart
    each found cold caches instead (13-35 GB/s; results.md, 2026-12-03 14:42)."""
    fastest = math.inf
    for burst in range(bursts):
        if burst:
            time.sleep(PROBE_GAP)
        for _ in range(tries):
            t = time.perf_counter()
            run()
            fastest = min(fastest, time.perf_counter() - t)
    return fastest


def cold_rate(pool: FilePool, windows: Sequence[tuple[str, int, int, int]]) -> float | None:
    """Bytes/s reading `windows` (path, fd, offset, length; not in the page cache) once each, the median
    window's (a busy machine preempts a few); their pages are dropped again afterwards, so the probe leaves
    the cache as it was."""
    if not windows:
        return None
    buf = np.zeros(max(n for *_, n in windows), np.uint8)
    buf.fill(1)  # its pages faulted in before the clock starts
    view = memoryview(buf)  # type: ignore[arg-type]  # numpy arrays are buffers
    rates = []
    for path, _, offset, n in windows:
        start = time.perf_counter()
        pool.handle(path).read_into(offset, view[:n])  # the confined handle; a short read is no error here
        seconds = time.perf_counter() - start
        if seconds > 0:
            rates.append(n / seconds)
    for _, fd, offset, n in windows:
        os.posix_fadvise(fd, offset, n, os.POSIX_FADV_DONTNEED)
    return sorted(rates)[len(rates) // 2] if rates else None


def read_rate(pool: FilePool, windows: Sequence[tuple[str, int, int]]) -> float | None:
    """Bytes/s one thread preads resident `windows` (path, offset, length; wholly in the page cache) into a
    1 MiB buffer, the faster of two passes over up to READ_PROBE bytes: what every buffered read of the run
    costs, on this machine's memory. None below READ_MIN bytes (too few to pass the caches)."""
    chosen, total = [], 0
    for path, offset, n in windows:
        if total >= READ_PROBE:
            break
        n = min(n, 1 << 20, READ_PROBE - total)
        chosen.append((pool.handle(path), offset, n))
        total += n
    if total < READ_MIN:
        return None
    view = memoryview(buffer(1 << 20))  # type: ignore[arg-type]  # numpy arrays are buffers
    view[:] = b"\x01" * len(view)  # faulted in before the clock starts

    def read_all() -> None:
        for handle, offset, n in chosen:
            handle.read_into(offset, view[:n])

    seconds = best(read_all, 1)
    return total / seconds if seconds > 0 else None


def copy_rate() -> float:
    """Bytes/s one core copies MEM_PROBE bytes from one buffer to another (the best try): the read rate's
    stand-in where nothing resident can be read (READ_PER_COPY)."""
    src = np.ones(MEM_PROBE, np.uint8)
    dst = np.zeros(MEM_PROBE, np.uint8)
    dst.fill(1)  # faulted in before the clock starts
    seconds = best(lambda: np.copyto(dst, src))
    return MEM_PROBE / seconds if seconds > 0 else 5e10


class Pace:
    """The core's speed at CRC-32, at plain Python, at the cast and at numpy's reductions, the best seen over
    every `sample` of a calibration.

    On a VM a core's speed is its host's to give: on the 2-core reference machine and on a 16-core VM
    alike, a loop's rate switched between ~17 M/s and ~10 M/s (CRC-32 with it, 4.3 and 2.2 GB/s) every few
    hundred milliseconds, whatever the load in the guest; of 25 prediction children on the VM, 4 took
    both probes in a slow phase and said +29 to +105 %. A run of seconds meets both phases, as the runs
    the constants were fitted on did; so the calibration samples throughout (the load's window included,
    `cpuload.others_busy`'s `meanwhile`) and keeps the fastest."""

    def __init__(self, cast: tuple[str, str] = ("float32", "bfloat16")) -> None:
        self.crc = 0.0  # bytes/s one core takes zlib's CRC-32 of (the universal export's zips)
        self.reduce = 0.0  # fp32 bytes/s one core passes through min, max and Σx² over a chunk (health's)
        self.python = 0.0  # iterations/s of a plain Python loop: per-read, per-file and per-job bookkeeping
        self.cast = 0.0  # elements/s one core casts `cast` (source, output dtype) by the workers' `cast_raw`
        self._data = np.arange(CRC_PROBE // 4, dtype=np.uint32).tobytes()
        self._dtypes = cast
        values = np.linspace(-2.0, 2.0, CAST_ELEMS, dtype=np.float64).astype(np.float32)
        self._src = np.empty(CAST_ELEMS * itemsize(cast[0]), np.uint8)
        cast_raw(values.view(np.uint8), "float32", self._src, cast[0], CAST_ELEMS)
        self._out = np.empty(CAST_ELEMS * itemsize(cast[1]), np.uint8)
        self._chunk = np.linspace(-2.0, 2.0, REDUCE_ELEMS, dtype=np.float32)

    def sample(self) -> None:
        """One burst of each probe (PROBE_TRIES tries, the best kept): ~4 ms here."""
        (src_dtype, out_dtype), src, out = self._dtypes, self._src, self._out
        crc = best(lambda: zlib.crc32(self._data), bursts=1)
        loop = best(_loop, bursts=1)
        cast = best(lambda: cast_raw(src, src_dtype, out, out_dtype, CAST_ELEMS), bursts=1)
        reduce = best(lambda: reduce_passes(self._chunk), bursts=1)
        self.crc = max(self.crc, CRC_PROBE / crc if crc > 0 else 0.0)
        self.reduce = max(self.reduce, 4 * REDUCE_ELEMS / reduce if reduce > 0 else 0.0)
        self.python = max(self.python, PY_LOOP / loop if loop > 0 else 0.0)
        self.cast = max(self.cast, CAST_ELEMS / cast if cast > 0 else 0.0)


def reduce_passes(x: np.ndarray[Any, Any]) -> None:
    """The reduction probe's work: three of health's passes over one fp32 chunk (`health.numerics`), min,
    max and Σx² (tests/benchmarks/probes.py times the same, so a machine's figure maps onto old rows)."""
    np.minimum.reduce(x)
    np.maximum.reduce(x)
    np.vecdot(x, x) if hasattr(np, "vecdot") else np.dot(x, x)  # as `numerics.row_dots`


def _loop() -> None:
    """The Python probe: a dict store, a tuple and a method call an iteration."""
    d: dict[int, tuple[int, int]] = {}
    for i in range(PY_LOOP):
        d[i & 255] = (i, i.bit_length())


def page_rate() -> float:
    """Bytes/s one core faults fresh pages in (PAGE_PROBE bytes of anonymous memory, one byte a page, the
    median of three mappings; returned to the kernel after each): what a page new to the page cache costs
    here now, which on a VM the host decides (`calibrate.PAGE_COST`)."""
    page = mmap.PAGESIZE
    times = []
    for _ in range(3):
        with mmap.mmap(-1, PAGE_PROBE) as m:
            t = time.perf_counter()
            for off in range(0, PAGE_PROBE, page):
                m[off] = 1
            times.append(time.perf_counter() - t)
    seconds = sorted(times)[1]
    return PAGE_PROBE / seconds if seconds > 0 else math.inf
