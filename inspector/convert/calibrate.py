"""Preflight's time from this machine: a short probe of the checkpoint's own files, their pages' residency,
the CPU and the cores, instead of constants.

`calibrate` looks at where the bytes a plan reads are (`system.residency`: `mincore` over a few windows of
each file, reading nothing), then times reads of a few 1 MiB windows that are not in the page cache (dropped
from it again afterwards, so the probe leaves the cache as it found it: the disk's rate), and takes the CPU's
rates one kind of work at a time (`rates`: a pread of the checkpoint's resident pages, CRC-32, a cast, a
plain Python loop, fresh pages faulted in), the kernel's freerun point of dirty pages (`system.writeback`)
and whether the run will ask its reads ahead (`FilePool.mostly_cold`). Its cost is bounded whatever the
checkpoint: at most PROBES MiB read cold and READ_PROBE twice warm, SAMPLES `mincore` windows per file, a
few milliseconds of the other probes (stated in `Calibration.seconds`). `estimate_seconds` turns it into a
run's time from what the run does with its bytes (`Work`, one shape for convert, universal and health): the
CPU's share (reading buffered bytes, casting, writing, zipping, reducing, fresh pages) spread over
min(workers, cores, pieces) threads, against what the disk serves for the bytes not in the cache and takes
back past the freerun point, the cores shared with what else is running, and each cost in the probe of its
own kind (a machine is not one factor faster: `rates`)."""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from inspector.convert import rates
from inspector.convert.reader import FilePool
from inspector.system.cpuload import others_busy
from inspector.system.limits import LOCAL_THREADS, gil_enabled, usable_cores
from inspector.system.residency import resident_share, sample_windows
from inspector.system.writeback import freerun_bytes

PROBES = 12  # windows not in the page cache read for the disk's rate (1 MiB each)
# assumed when no window can be probed (a fully warm checkpoint), measured on the 2-core reference machine:
# the disk serves 400 MB/s cold
FALLBACK_COLD = 4e8
# CPU per byte, in units of the read probe's rate (`rates.read_rate`: a pread of the checkpoint's resident
# pages), that a run streams from the page cache (READ_COST: the probe's own work, so 1 and not fitted),
# writes into it with pwrite (its copy; each new page at the page probe's rate, below), copies file to file
# in the kernel, writes into a torch zip besides its CRC-32 (universal's `.pt`: a buffered write; the CRC-32
# is one pass at the CRC probe's rate, 30 % of universal's CPU here by `perf`) and reduces (health's
# statistics). READ_COST and the Python costs were fitted by
# tests/benchmarks/fit_preflight.py (2026-12-04 15:08 UTC) to 16 warm runs of the 200M demos here (ZeRO-3
# health, bf16 and universal, ZeRO-2 health; 1 and 2 workers, twice; the Python costs below held as
# converted from the copy-probe fit, 2026-11-27's 120 runs): 13 of 16 within 25 %, rms log error 0.21 (3 of
# 16 with the converted constants). Checked where they were not fitted: a 16-core VM's worker and rank
# sweeps, 22 of 25 runs within 25 % (the copy-probe model there: 5 of 25, +60 to +290 %), and this
# machine's next sweeps, 20 of 25 (results.md, 2026-12-04 14:54-15:28)
READ_COST = 1.0
# every page new to the page cache, a page of output written, copied or zipped or a page the disk fills for a
# read, costs the run a fresh page at the page probe's rate now (PAGE_COST of its time a byte; on this VM a
# fresh page is the host's to give back: 0.6-1.7 us within a second of the last run, 5-10 us after a pause,
# results.md 2026-11-26), and WRITE_COST, COPY_COST and ZIP_COST price the rest in the read probe's units: a
# pwrite's copy, nothing much for the kernel's file-to-file copy (its pages cost what the page probe's do,
# whose faults each trap: the copy's memory traffic is in that), the zip's buffering. Until 2026-12-04 only a
# page's cost beyond the fit's (4 GB/s) was priced apart, the fit's own held in constants fitted where a copy
# cost 5.8 times a read: an fp32 export (a copy) said +46 to +176 % on a 2-core Xeon VM and +65 to +203 % on
# the AMD one; universal (zipped writes) -28 to -56 % on the Xeon and -29 to -64 % on the AMD (a new file's
# pwrite ran at 2.8 GB/s on the Xeon; its read and page probes together say 2.6). Refitted (only these three,
# every other constant held) on 16 warm rows of the Xeon VM (tests/benchmarks/rows/2026-12-04-xeon: the 200M
# ZeRO-2 and -3 demos' bf16, fp32, universal and health at 1 and 2 workers; 12 of 16 within 25 %), checked on
# its 37 other rows (a second sweep, the rank sweep to 4,096 ranks: 35 of 37, rms log error 0.12; 27 of 37
# before) and on a sweep after the refit (12 of 16: three at +26 to +28 %, one bf16 run of 1.24 s against its
# usual 0.8 s). Cold runs took more CPU than warm ones (2026-11-27 00:27 and 00:30, 1 worker: health 1.52 /
# 1.17 CPU-s against 0.95 / 0.75, universal 3.90 / 2.70 against 1.54 / 1.58)
PAGE_COST = 1.0
WRITE_COST = 1.4
COPY_COST = 0.022
ZIP_COST = 2.62  # the zip's buffered write; its CRC-32 (a third of universal's CPU here, `perf`) apart
# health: REDUCE_COST per byte whose statistics are computed, CHECK_COST per byte of a 16-bit copy checked
# against its master besides (its widening, the rounding check's passes), both in units of the reduction
# probe's byte (`rates.Pace`: min, max and Σx² over a 4 MiB chunk). Priced in the read probe they followed
# each checkpoint's page cache (7.4-15.5 GB/s here over a week, the runs steady): ZeRO-2's health at 1
# worker said +35 to +48 % on 2026-12-04. Fitted, every other constant held, on 8 health rows here (ZeRO-2
# and -3 200M demos, 1 and 2 workers, warm; 8 within 25 %, -17 to +2 %) and the 16-core VM's 25 rows
# (its reduction probe from probes.py's run beside them: 22 within 25 %, as before)
REDUCE_COST = 1.375
CHECK_COST = 15.17
# Python's costs, in iterations of the Python probe's loop (`rates.Pace`, ~17 M/s here), each on one
# thread whatever the workers (the GIL). STARTUP_CPU: the CPU-seconds of the interpreter, the imports, the
# plan and the exit at PY_REF iterations/s, besides the scan (measured apart, `Work.startup`): the rank
# sweep's 8-rank convert took 0.42-0.55 CPU-s, its work and scan ~0.1 (2026-12-03)
STARTUP_CPU = 0.30
PY_REF = 1.7e7
# per output file, beyond its bytes (created, its zip's records and pickle, renamed, a journal line): ~0.35
# ms a file here quiet (a 300K-parameter ZeRO-3 demo's universal export, 67 files; the 126-layer 20M demo's,
# 3,795 files: 2.40-2.48 s at 1 worker, 2.94-2.98 s at 2, 2026-12-04); 6340 until the rank sweep of
# 2026-12-05 04:45 put the reads that came with those files at their own cost (GATHERED_RANGE_COST): fitted
# with it there, universal's 135 / 1,151 / 4,223 files at 8 / 1,024 / 4,096 ranks read +22 / -1 / -6 %
FILE_COST = 10080.0
# per read beyond its bytes (a pread, the Python around it, the plan's record of it): a stage-3 checkpoint
# is read a parameter a rank, 21,280 reads at 1,024 ranks of the 20M demo, 70,215 at 4,096, 314 at 8;
# ~12 us a read here since a read holds its file in one lock round trip (`FilePool._hold`; was 362, ~21 us:
# refitted on the rank sweep of 2026-12-05 04:19, convert +21 / +20 % before, +3 / -2 % after); 234 until
# the 126-layer demo's convert at 1,024 ranks (73 K reads of ~1 KB, stripes that fit the cache) read +38 %:
# fitted on both rank sweeps of 2026-12-05 ~09:55 (~10 us), the 20M demo +13 / -9 / -13 % at 8 / 1,024 /
# 4,096 ranks, the 126-layer one -6 / +18 % at 8 / 1,024 (the 20M demo's 5.7 MB stripes, past the 2 MiB
# L2, cost ~10 us a read in-process against the 126-layer's ~6: a per-read constant splits the two)
RANGE_COST = 168.0
# reads gathered by `FilePool.read_runs` (health's chunks, universal's stripes of small stage-3 slices):
# a chunk's or a stripe's ranges in one call, nothing written or recorded per read: ~5 us here since a read
# holds its file in one lock round trip (`FilePool._hold`) and a stripe's batch is read by one thread at a
# time (`MANY_RUNS`). Rank sweep of 2026-12-05 04:45 UTC, 104,816 reads at 1,024 ranks, 374,291 at 4,096:
# health +8 / -3 % (+50 / +38 % at the old 210, ~12 us), universal -1 / -6 % (with FILE_COST)
GATHERED_RANGE_COST = 93.0
# each health job beyond its bytes: its accumulator and chunks' Python, its row, its findings and its place
# in the report (the 126-layer demo, 3,789 jobs of ~16 K elements: ~0.3 ms a job here)
JOB_COST = 5070.0
# threads past LOCAL_THREADS under the GIL: their handoffs are the pass, and the cores they are worth fall
# as LOCAL_THREADS * (LOCAL_THREADS / threads) ** GIL_FALL (16-core VM, 2026-12-04, 200M demos warm: health's
# pass 0.35 / 0.59 / 1.10 s at 4 / 8 / 16 workers, bf16 0.26 / 0.33 / 0.66, universal 0.66 / 0.66 / 0.96;
# fitted to its 16 sweep rows, every other constant held: no 2-core machine can tell)
GIL_FALL = 0.84
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
    "GATHERED_RANGE_COST",
    "JOB_COST",
    "RANGE_COST",
    "FILE_COST",
    "GIL_FALL",
)


@dataclass(frozen=True)
class Calibration:
    """What this machine does with this checkpoint's bytes, now."""

    resident: float  # fraction of the bytes to read that are in the page cache
    cold_rate: float  # bytes/s one thread reads from the disk
    cast_rate: float  # elements/s one core casts (the run's commonest cast)
    cores: int
    load: float  # CPUs' worth of other work on our CPUs now (`system.cpuload.others_busy`)
    seconds: float  # what calibrating cost
    probed: bool  # whether the rates were measured (else assumed)
    read_rate: float  # bytes/s one thread preads resident pages (`rates.read_rate`)
    crc_rate: float  # bytes/s one core takes CRC-32 of
    py_rate: float  # iterations/s of the Python probe's loop
    reduce_rate: float  # fp32 bytes/s one core passes through min, max and Σx² over a chunk (`rates.Pace`)
    freerun: float = math.inf  # bytes a run writes before the kernel paces it to the disk (`writeback`)
    read_ahead: bool = False  # the run will ask its reads of the kernel ahead (`FilePool.mostly_cold`)
    page_rate: float = math.inf  # bytes/s of fresh pages one core faults in (the page probe)
    gil: bool = True  # threads take turns in the interpreter (`limits.gil_enabled`)


def calibrate(
    pool: FilePool, reads: Mapping[str, int], cast: tuple[str, str] = ("float32", "bfloat16")
) -> Calibration:
    """Probe the files `reads` names (path -> bytes a run reads from it) through `pool` (the confined
    sources), and the run's commonest `cast` (source, output dtype). Local files only: the caller uses the
    network's model for a store."""
    start = time.perf_counter()
    pace = rates.Pace(cast)  # the core's speed, sampled now and through the load's window (`rates.Pace`)
    pace.sample()
    cold: list[tuple[str, int, int, int]] = []
    warm: list[tuple[str, int, int]] = []
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
        warm += [(path, o, n) for o, n, f in windows if f == 1.0]
    cold_rate = rates.cold_rate(pool, cold) or FALLBACK_COLD
    read_rate = rates.read_rate(pool, warm) or rates.copy_rate() * rates.READ_PER_COPY  # nothing resident
    page_rate = rates.page_rate()
    # after the probes (sampled between its reads, predictions went wrong), the core's pace sampled through it
    load = others_busy(meanwhile=pace.sample)
    return Calibration(
        resident=resident / total if total else 1.0,
        cold_rate=cold_rate,
        cast_rate=pace.cast,
        read_rate=read_rate,
        crc_rate=pace.crc,
        py_rate=pace.python,
        reduce_rate=pace.reduce,
        page_rate=page_rate,
        freerun=freerun_bytes(),
        cores=usable_cores(),
        load=load,
        seconds=time.perf_counter() - start,
        probed=bool(cold),
        read_ahead=pool.mostly_cold(reads),  # the run's own test, on the same files: its decision
        gil=gil_enabled(),
    )


@dataclass(frozen=True)
class Work:
    """What a run does with its bytes: the one shape the time model takes, for convert, universal and health.

    `read` is every byte read (`copied` included: the disk serves both); the rest say what the CPU does with
    them, each at its own cost per byte in the probe of its kind (`rates`)."""

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
    ranges: int = 0  # separate reads (adjacent segments of a file are one), each at RANGE_COST
    # reads gathered by `read_runs` (health's chunks, universal's stripes), at GATHERED_RANGE_COST each
    gathered_reads: bool = False
    jobs: int = 0  # health's jobs, each at JOB_COST on one thread
    # CPU-seconds of start-up beyond the interpreter and imports (STARTUP_CPU): the scan the run repeats, as
    # this process measured it (`Checkpoint.scan_cpu`): 0.04 s for 16 rank files, ~1 s for 2,048
    startup: float = 0.0


def overlaps(cal: Calibration, work: Work) -> bool:
    """Whether the disk's part of `work` runs beside its CPU's part here, now."""
    return work.overlapped or (work.read_ahead and cal.read_ahead)


def estimate_seconds(cal: Calibration, workers: int, work: Work) -> float:
    """Seconds a run takes here, start-up included. The CPU's part, each cost in the probe of its kind (a
    faster CPU or memory is a faster run), runs on min(workers, cores, pieces) threads, shared with what
    else is runnable, the writes into a file on no more threads than files written at once (its inode's
    lock). The disk's part: the bytes not in the page cache, overlapped with the CPU's unless each worker
    reads, then works, with nothing asked ahead (`overlaps`), and the bytes written past the kernel's
    freerun point (`system.writeback`), which go back to the disk as the run writes; the disk's streaming
    read rate stands in for its write-back rate (no write probe: it would dirty the disk; fitted on the 500M
    demo's universal runs, whose 6 GB pass that point here, the write-back rate came out at 1.17 times it).
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
    """CPU-seconds on one thread whatever the workers, at the Python probe's rate: start-up, the scan the
    run repeats, each read's Python bookkeeping (under the GIL: the rank sweep's convert took as much wall
    as CPU at 2 workers), each health job's, each output file's (a universal export of 3,795 small files
    took 2.4 s at 1 worker, 2.9 at 2)."""
    per_read = GATHERED_RANGE_COST if work.gathered_reads else RANGE_COST
    loops = per_read * work.ranges + JOB_COST * work.jobs + FILE_COST * work.files
    return STARTUP_CPU * PY_REF / cal.py_rate + work.startup + loops / cal.py_rate


def cpu_seconds(cal: Calibration, work: Work) -> tuple[float, float]:
    """CPU-seconds of the run's work after start-up: (what spreads over the threads, the writes into its
    files). Bytes through memory at their cost per byte in units of the read probe's rate, health's
    statistics in the reduction probe's (numpy's passes over a chunk of our own buffers, not the page
    cache's pages), each zipped byte's CRC-32 at the CRC probe's, each cast at the cast probe's. Every
    buffered byte is copied out of the page cache, wherever it was; the bytes the disk serves cost the
    kernel's fill besides, so a cold run never takes less CPU than a warm one."""
    buffered = work.read - work.copied
    memory = READ_COST * buffered + ZIP_COST * work.zipped
    numpy = REDUCE_COST * work.reduced + CHECK_COST * work.checked
    compute = memory / cal.read_rate + numpy / cal.reduce_rate + work.zipped / cal.crc_rate
    compute += work.cast_elems / cal.cast_rate
    page = PAGE_COST / cal.page_rate  # seconds a byte new to the page cache costs in fresh pages
    compute += page * (work.read * (1.0 - cal.resident) + work.zipped)
    writing = (WRITE_COST * work.written + COPY_COST * work.copied) / cal.read_rate
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
    """Cores `threads` busy threads get: all of them, or on a busy machine their share of the cores, and
    under the GIL fewer past LOCAL_THREADS (GIL_FALL). (A
    probe of what one thread got over 40 ms of copying, tried in its place on 2026-12-03 under a load of
    4-10, scattered more: rms log error 0.76 against 0.64 on the same 12 runs.)"""
    threads = max(1, threads)
    runnable = cal.load + threads
    cores = threads if runnable <= cal.cores else threads * cal.cores / runnable
    if cal.gil and threads > LOCAL_THREADS:  # past a few threads the GIL's handoffs are the pass
        cores = min(cores, LOCAL_THREADS * (LOCAL_THREADS / threads) ** GIL_FALL)
    return cores
