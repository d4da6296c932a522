"""Preflight's time from this machine: a short probe of the checkpoint's own files, their pages' residency,
the CPU and the cores, instead of constants.

`calibrate` looks at where the bytes a plan reads are (`system.residency`: `mincore` over a few windows of
each file, reading nothing), then times reads of a few 1 MiB windows that are not in the page cache (dropped
from it again afterwards, so the probe leaves the cache as it found it: the disk's rate), a 4 MiB copy in
memory (the CPU's rate, the unit of every per-byte cost: reads of resident windows ran at 7-30 GB/s by how the
kernel held each one, so they no longer set it), fresh pages faulted in (what a page new to the page cache
costs), a cast of 256 Ki fp32 values to bf16, and reads the kernel's freerun point of dirty pages
(`system.writeback`) and whether the run will ask its reads ahead (`FilePool.mostly_cold`). Its cost is
bounded whatever the checkpoint: at most PROBES MiB read, SAMPLES `mincore` windows per file, a few
milliseconds of copying, casting and faulting (stated in `Calibration.seconds`). `estimate_seconds` turns it
into a run's time from what the run does with its bytes (`Work`, one shape for convert, universal and
health): the CPU's share (copying buffered bytes, casting, writing, zipping, reducing, fresh pages) spread
over min(workers, cores, pieces) cores, against what the disk serves for the bytes not in the cache and takes
back past the freerun point, the cores shared with what else is running."""

from __future__ import annotations

import math
import mmap
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from inspector.convert.cast import cast_raw
from inspector.convert.reader import FilePool
from inspector.format.dtypes import itemsize
from inspector.system.cpuload import others_busy
from inspector.system.limits import usable_cores
from inspector.system.residency import resident_share, sample_windows
from inspector.system.writeback import freerun_bytes

PROBES = 12  # windows not in the page cache read for the disk's rate (1 MiB each)
# assumed when no window can be probed (a fully warm checkpoint), measured on the 2-core reference machine:
# the disk serves 400 MB/s cold
FALLBACK_COLD = 4e8
# CPU per byte, in units of the copy probe's in-memory rate, a run streams from the page cache, writes into
# it with pwrite (page allocation and copy), copies file to file in the kernel, writes into a torch zip
# (universal's `.pt`: CRC-32 and a buffered write) and reduces (health's statistics); the CPU-seconds before
# the first byte (interpreter, imports; the scan measured apart, see STARTUP_CPU). Refitted by
# tests/benchmarks/fit_preflight.py (2026-11-27, 00:27-00:44 UTC) to three quiet sweeps on the 2-core
# reference machine, the 200M ZeRO-2 and ZeRO-3 demos and the 500M ZeRO-2 demo together (1-16 workers,
# warm and cold, each run after a warm-up within a second, see sweep.py: 120 runs), READ_COST held at what
# the one-thread floor's page-cache read gives (14 GB/s against the probe's ~50): 95 of 120 within 25 %,
# rms log error 0.21. Checked on the 96 runs of the evening before (the constants' previous fit set, 200M,
# and a 500M sweep): 77 of 96 (the constants fitted on 200M alone: 76, and 9 of the 16 at 500M against 13
# now; sizes together part the start-up from the per-byte costs). The misses are the VM's first touch of fresh pages (bf16 warm, up to -48 %) and cold
# rows whose disk rate moved between the probe and the run (up to +82 %).
# Each extra thread was worth a whole core and the load sampled at the probe counted in full (those terms,
# offered to an earlier fit, came out at their bounds and were dropped).
READ_COST = 3.5
# every page new to the page cache, a page of output written or a page the disk fills for a read, costs
# the run a fresh page, PAGE_COST times what the page probe's fresh anonymous pages cost now beyond what
# they cost in the runs the constants were fitted on (FITTED_PAGE_RATE: each within a second of a warm-up,
# ~1 us a page, so WRITE_COST, COPY_COST and ZIP_COST hold that much). On this VM a fresh page is the
# host's to give back: 0.6-1.7 us within a second of the last run, 5-10 us after a pause (results.md,
# 2026-11-26), 2.4-4 us in the page probe and 11-21 us in 16 MiB mappings under the shared load of
# 2026-12-03. Cold runs took more CPU than warm ones (2026-11-27 00:27 and 00:30, 1 worker: health 1.52 /
# 1.17 CPU-s against 0.95 / 0.75, universal 3.90 / 2.70 against 1.54 / 1.58)
PAGE_COST = 1.0
FITTED_PAGE_RATE = 4e9
WRITE_COST = 11.8
COPY_COST = 14.2
ZIP_COST = 32.9  # 34.3 as fitted, less what FILE_COST takes of it: the fit's exports wrote 247 files each
# (the 200M and 500M demos), 1.8 (200M) and 0.7 (500M) of it per byte zipped
# health: REDUCE_COST per byte whose statistics are computed, CHECK_COST per byte of a 16-bit copy checked
# against its master besides (its widening, the rounding check's passes: a ZeRO-2 copy's 2 bytes an element
# cost what ~20 bytes of fp32 statistics do). One REDUCE_COST (7.54) for both put the 200M ZeRO-3 demo's
# warm runs at +28 to +33 % and the ZeRO-2 one's at -16 to +18 %. Fitted together on two health sweeps of
# both 200M demos, warm and cold, 1 and 2 workers (2026-12-04 09:07, quiet; every other constant held): 14
# of 16 rows within 25 % (10 before); each sweep's fit on the other's rows: 7 and 6 of 8
REDUCE_COST = 3.93
CHECK_COST = 40.2
# the CPU-seconds of the interpreter, the imports, the plan and the exit, besides the scan (measured apart,
# `Work.startup`): the rank sweep's 8-rank convert took 0.42-0.55 CPU-s, its work and scan ~0.1 (2026-12-03,
# compiled bytecode as installed; the 0.353 fitted before held the 200M demos' scans and, in this shell's
# `PYTHONDONTWRITEBYTECODE`, the package's compilation)
STARTUP_CPU = 0.30
# CPU per output file, beyond its bytes (created, its zip's records and pickle, renamed, a journal line),
# in bytes the copy probe copies in as long: measured in process on a 300K-parameter ZeRO-3 demo, whose
# universal export writes 67 files of 3.7 MB in all (2026-12-03, 1 worker, 4 runs): 0.90-1.22 ms a file
# under a load average of 8, when the same load made health's CPU 2.9-3.3x the quiet sweep's, so ~0.35 ms
# quiet. Universal's many small files: a model of many small tensors is not its bytes alone. On one thread
# whatever the workers (its Python holds the GIL): the 126-layer 20M demo's export (3,795 files) took
# 2.40-2.48 s at 1 worker and 2.94-2.98 s at 2, where spread over 2 threads it was predicted 1.46 s
# (2026-12-04, /dev/shm; 0.45 ms a file at this machine's copy rate, as fitted)
FILE_COST = 17.5e6
# CPU per read beyond its bytes (a pread, the Python around it, the plan's record of it), in bytes the copy
# probe copies in as long, on one thread (the Python holds the GIL): a stage-3 checkpoint is read a
# parameter a rank, 39,705 reads at 1,024 ranks of the 20M demo, 134,555 at 4,096, 354 at 8. From the rank
# sweeps of 2026-12-03 14:34-14:56 (three, CPU-seconds less start-up and the scan: 0.8-1.1e6 at 1,024
# ranks, 0.8-1.07e6 at 4,096)
RANGE_COST = 1.0e6
# health's reads: a chunk's ranges fetched by one `read_runs` into the worker's buffers, nothing written or
# recorded per read. With RANGE_COST preflight said +59 % at 1,024 ranks and +30 % at 4,096 for health on
# the 20M demo (rank sweep of 2026-12-04 00:23 UTC: 104,816 reads at 1,024 ranks, ~8 us each beyond the
# rest of the model; ~15 us at 4,096, whose 8,192 files pass the descriptor pool's cap): 12 us here
HEALTH_RANGE_COST = 0.58e6
# each health job beyond its bytes: its accumulator and chunks' Python, its row, its findings and its place
# in the report, on one thread. The 126-layer demo (3,789 jobs of ~16 K elements) took 1.3-1.9 s at 8 ranks
# where its bytes alone predicted 0.45 s: ~0.3 ms a job here
JOB_COST = 14e6
CAST_ELEMS = 1 << 18
MEM_PROBE = 4 << 20  # bytes copied in memory by the copy probe (twice its size held for a millisecond)
PROBE_TRIES, PROBE_GAP = 5, 5e-3  # the copy and cast probes' tries a burst, and the seconds between bursts
PAGE_PROBE = 1 << 20  # bytes of fresh anonymous memory the page probe faults in, three times
# a run streams whole ranges from the disk with the kernel's readahead, about twice what the probe's
# isolated 1 MiB reads measure (0.6-1.9 GB/s probed; the sweep's one-thread floor read 1.9-2.2 GB/s); refitted
STREAM_GAIN = 2.37
FITTED = (
    "READ_COST",
    "PAGE_COST",
    "WRITE_COST",
    "COPY_COST",
    "ZIP_COST",
    "REDUCE_COST",
    "CHECK_COST",
    "STARTUP_CPU",
    "STREAM_GAIN",
    "HEALTH_RANGE_COST",
    "JOB_COST",
    "RANGE_COST",
)


@dataclass(frozen=True)
class Calibration:
    """What this machine does with this checkpoint's bytes, now."""

    resident: float  # fraction of the bytes to read that are in the page cache
    cold_rate: float  # bytes/s one thread reads from the disk
    cast_rate: float  # elements/s one core casts (the run's commonest cast)
    copy_rate: float  # bytes/s one core copies between two MEM_PROBE buffers: the CPU and its caches
    cores: int
    load: float  # CPUs' worth of other work on our CPUs now (`system.cpuload.others_busy`)
    seconds: float  # what calibrating cost
    probed: bool  # whether the rates were measured (else assumed)
    freerun: float = math.inf  # bytes a run writes before the kernel paces it to the disk (`writeback`)
    read_ahead: bool = False  # the run will ask its reads of the kernel ahead (`FilePool.mostly_cold`)
    page_rate: float = math.inf  # bytes/s of fresh pages one core faults in (the page probe)


def calibrate(
    pool: FilePool, reads: Mapping[str, int], cast: tuple[str, str] = ("float32", "bfloat16")
) -> Calibration:
    """Probe the files `reads` names (path -> bytes a run reads from it) through `pool` (the confined
    sources), and the run's commonest `cast` (source, output dtype). Local files only: the caller uses the
    network's model for a store."""
    start = time.perf_counter()
    cold: list[tuple[str, int, int, int]] = []
    resident, total = 0.0, 0
    for path, nbytes in sorted(reads.items(), key=lambda kv: -kv[1]):
        fd = pool.fd(path)
        windows = sample_windows(fd) if fd is not None else None
        if fd is None or windows is None:
            resident += nbytes  # cannot tell: as the page cache usually holds a checkpoint just written
            total += nbytes
            continue
        resident += nbytes * resident_share(windows)
        total += nbytes
        cold += [(path, fd, o, n) for o, n, f in windows if f == 0.0][: PROBES - len(cold)]
    cold_rate = _rate(pool, cold) or FALLBACK_COLD
    return Calibration(
        resident=resident / total if total else 1.0,
        cold_rate=cold_rate,
        cast_rate=_cast_rate(*cast),
        copy_rate=_copy_rate(),
        page_rate=_page_rate(),
        freerun=freerun_bytes(),
        cores=usable_cores(),
        load=others_busy(),  # after the probes: sampled between its reads, predictions went wrong
        seconds=time.perf_counter() - start,
        probed=bool(cold),
        read_ahead=pool.mostly_cold(reads),  # the run's own test, on the same files: its decision
    )


def _rate(pool: FilePool, windows: list[tuple[str, int, int, int]]) -> float | None:
    """Bytes/s reading `windows` (not in the page cache) once each, the median window's (a busy machine
    preempts a few); their pages are dropped again afterwards, so the probe leaves the cache as it was."""
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


def _copy_rate() -> float:
    """Bytes/s one core copies MEM_PROBE bytes from one buffer to another (the best try): what the CPU and
    its caches do with bytes in memory, whatever state the page cache is in."""
    src = np.ones(MEM_PROBE, np.uint8)
    dst = np.zeros(MEM_PROBE, np.uint8)
    dst.fill(1)  # faulted in before the clock starts
    best = _best(lambda: np.copyto(dst, src), PROBE_TRIES)
    return MEM_PROBE / best if best > 0 else 5e10


def _best(run: Callable[[], object], tries: int) -> float:
    """The fastest of `tries` runs of `run`, back to back (the first warms the caches for the rest), in two
    bursts a few milliseconds apart: a probe measures what a core can do, the load (`system.cpuload`) what
    share of it the run will get. One burst of five once fell inside another process's busy moment (the copy
    probe read 7.4 GB/s where its best is 48, the prediction 2x the run); tries spread a millisecond apart
    each found cold caches instead (13-35 GB/s; results.md, 2026-12-03 14:42)."""
    best = math.inf
    for burst in range(2):
        if burst:
            time.sleep(PROBE_GAP)
        for _ in range(tries):
            t = time.perf_counter()
            run()
            best = min(best, time.perf_counter() - t)
    return best


def _page_rate() -> float:
    """Bytes/s one core faults fresh pages in (PAGE_PROBE bytes of anonymous memory, one byte a page, the
    median of three mappings; returned to the kernel after each): what a page new to the page cache costs
    here now, which on a VM the host decides (`PAGE_COST`)."""
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


def _cast_rate(src_dtype: str, out_dtype: str) -> float:
    """Elements/s one core casts `src_dtype` to `out_dtype` (the best try), by the raw-buffer cast the
    converter's workers run (`cast_raw`: fp32 -> bf16 on the bits, so preflight imports no ml_dtypes)."""
    values = np.linspace(-2.0, 2.0, CAST_ELEMS, dtype=np.float64).astype(np.float32)
    src = np.empty(CAST_ELEMS * itemsize(src_dtype), np.uint8)
    cast_raw(values.view(np.uint8), "float32", src, src_dtype, CAST_ELEMS)
    out = np.empty(CAST_ELEMS * itemsize(out_dtype), np.uint8)
    best = _best(lambda: cast_raw(src, src_dtype, out, out_dtype, CAST_ELEMS), PROBE_TRIES)
    return CAST_ELEMS / best if best > 0 else 1e9


@dataclass(frozen=True)
class Work:
    """What a run does with its bytes: the one shape the time model takes, for convert, universal and health.

    `read` is every byte read (`copied` included: the disk serves both); the rest say what the CPU does with
    them, each at its own cost per byte relative to the probe's resident read."""

    read: int
    written: int = 0  # bytes written with pwrite from a buffer
    cast_elems: int = 0  # elements cast (the calibrated cast)
    copied: int = 0  # bytes copied file to file in the kernel (never read into Python)
    zipped: int = 0  # bytes written into a torch zip with their CRC-32 (universal's `.pt` files)
    reduced: int = 0  # bytes whose statistics are computed (health)
    checked: int = 0  # bytes of 16-bit copies checked against their masters besides (health's module copies)
    pieces: int = 0  # independent pieces (files, streams) the workers share: no more run at once (0: any)
    files: int = 0  # output files written, each at FILE_COST beyond its bytes
    outputs: int = 0  # files written at once (0: as many as the workers): writes into one file take its
    # inode's lock in turn, so `written` and `copied` go no faster with more threads than files
    # whether the disk's part overlaps the CPU's: not where each worker reads a chunk, then works on it and
    # writes it before reading the next (universal's zip): there a cold page cache adds the disk's time
    # (quiet sweep: 1 worker 5.52 s warm, 7.10 s cold, the cold one-thread floor 1.32 s)
    overlapped: bool = True
    # whether the run asks the kernel for its reads ahead when most of them are not cached (universal's
    # READ_AHEAD, health's `read_ahead`): then the disk reads the next window while the worker works on this
    # one, and its part overlaps the CPU's whatever `overlapped` says (`Calibration.read_ahead`: the run's
    # own test, `FilePool.mostly_cold`, asked of the same files)
    read_ahead: bool = False
    ranges: int = 0  # separate reads (adjacent segments of a file are one), each at `range_cost`
    range_cost: float = RANGE_COST  # a read's CPU, in bytes the copy probe copies as long (health's less)
    jobs: int = 0  # health's jobs, each at JOB_COST on one thread
    # CPU-seconds of start-up beyond the interpreter and imports (STARTUP_CPU): the scan the run repeats, as
    # this process measured it (`Checkpoint.scan_cpu`): 0.04 s for 16 rank files, ~1 s for 2,048
    startup: float = 0.0


def overlaps(cal: Calibration, work: Work) -> bool:
    """Whether the disk's part of `work` runs beside its CPU's part here, now."""
    return work.overlapped or (work.read_ahead and cal.read_ahead)


def estimate_seconds(cal: Calibration, workers: int, work: Work) -> float:
    """Seconds a run takes here, start-up included. The CPU's part, in units of the copy probe's rate (a
    faster CPU or memory is a faster run), runs on min(workers, cores, pieces) threads, shared with what
    else is runnable, the writes into a file on no more threads than files written at once (its inode's
    lock). The disk's part: the bytes not in the page cache, overlapped with the CPU's unless each worker
    reads, then works, with nothing asked ahead (`overlaps`), and the bytes written past the kernel's freerun point
    (`system.writeback`), which go back to the disk as the run writes; the disk's streaming read rate
    stands in for its write-back rate (no write probe: it would dirty the disk; fitted on the 500M demo's
    universal runs, whose 6 GB pass that point here, the write-back rate came out at 1.17 times it).
    Locally no run has more busy threads than cores (`limits.busy_threads`)."""
    threads = min(workers, cal.cores, work.pieces or workers)
    writers = min(threads, work.outputs or threads)
    compute, writing = cpu_seconds(cal, work)
    busy = compute / _share(threads, cal) + writing / _share(writers, cal)
    stream = cal.cold_rate * STREAM_GAIN  # the disk's streaming rate
    disk = work.read * (1.0 - cal.resident) / stream
    dirty = work.written + work.copied + work.zipped
    drain = max(0.0, dirty - cal.freerun) / stream  # past the freerun point, as fast as the disk streams
    serial = 0.0 if overlaps(cal, work) else disk
    return alone_seconds(cal, work) / _share(1, cal) + max(busy + serial, disk + drain)


def alone_seconds(cal: Calibration, work: Work) -> float:
    """CPU-seconds on one thread whatever the workers: start-up, the scan the run repeats, each read's Python
    bookkeeping (under the GIL: the rank sweep's convert took as much wall as CPU at 2 workers), each health
    job's, each output file's (a universal export of 3,795 small files took 2.4 s at 1 worker, 2.9 at 2)."""
    return (
        STARTUP_CPU
        + work.startup
        + (work.range_cost * work.ranges + JOB_COST * work.jobs + FILE_COST * work.files) / cal.copy_rate
    )


def cpu_seconds(cal: Calibration, work: Work) -> tuple[float, float]:
    """CPU-seconds of the run's work after start-up: (what spreads over the threads, the writes into its
    files), each at its cost per byte in units of the copy probe's rate. Every buffered byte is copied out
    of the page cache, wherever it was; the bytes the disk serves cost the kernel's fill besides, so a cold
    run never takes less CPU than a warm one."""
    buffered = work.read - work.copied
    compute = READ_COST * buffered + ZIP_COST * work.zipped
    compute += REDUCE_COST * work.reduced + CHECK_COST * work.checked
    compute = compute / cal.copy_rate + work.cast_elems / cal.cast_rate
    page = PAGE_COST * max(0.0, 1.0 / cal.page_rate - 1.0 / FITTED_PAGE_RATE)  # seconds a fresh byte adds
    compute += page * (work.read * (1.0 - cal.resident) + work.zipped)
    writing = (WRITE_COST * work.written + COPY_COST * work.copied) / cal.copy_rate
    writing += page * (work.written + work.copied)
    return compute, writing


def calibrated_seconds(
    sources: tuple[Any, ...],
    reads: Mapping[str, int],
    work: Work,
    workers: int,
    cast: tuple[str, str] = ("float32", "bfloat16"),
) -> float:
    """`work`'s time on this machine now: calibrated on the files `reads` names (path -> bytes read from
    each), opened through `sources` (the run's confined sources), for `workers` threads."""
    with FilePool(*sources) as pool:
        cal = calibrate(pool, reads, cast)
    return estimate_seconds(cal, workers, work)


def _share(threads: int, cal: Calibration) -> float:
    """Cores `threads` busy threads get: all of them, or on a busy machine their share of the cores. (A
    probe of what one thread got over 40 ms of copying, tried in its place on 2026-12-03 under a load of
    4-10, scattered more: rms log error 0.76 against 0.64 on the same 12 runs.)"""
    threads = max(1, threads)
    runnable = cal.load + threads
    return threads if runnable <= cal.cores else threads * cal.cores / runnable
