"""Preflight's time from this machine: page residency told without reading (mincore), a probe bounded
whatever the checkpoint, the probe leaving the cache as it found it, and a model that follows the workers,
the cores, the load and the cache state."""

from __future__ import annotations

import itertools
import math
import os
import sys
from collections import Counter
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any, cast

import pytest

from inspector.convert import calibrate as cal_mod
from inspector.convert import rates
from inspector.convert.calibrate import PROBES, Calibration, Work, calibrate, estimate_seconds
from inspector.convert.reader import FilePool
from inspector.system import limits
from inspector.system.residency import resident_fraction
from inspector.system.source import Source

MiB = 1 << 20
pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="mincore is Linux only")


def _file(tmp_path: Path, size: int) -> Path:
    path = tmp_path / "rank.bin"
    with open(path, "wb") as fh:
        fh.write(os.urandom(size))
        fh.flush()
        os.fsync(fh.fileno())  # clean pages: DONTNEED drops them at once
    return path


def _drop(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def test_residency_is_told_without_reading(tmp_path: Path) -> None:
    path = _file(tmp_path, 80 * MiB)
    fd = os.open(path, os.O_RDONLY)
    try:
        _drop(path)
        assert resident_fraction(fd) == pytest.approx(0.0, abs=0.05)
        assert resident_fraction(fd) == pytest.approx(0.0, abs=0.05)  # asking read nothing in
        path.read_bytes()
        assert resident_fraction(fd) == pytest.approx(1.0, abs=0.05)
    finally:
        os.close(fd)


def test_the_probe_is_bounded_and_leaves_the_cache_as_it_was(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = _file(tmp_path, 200 * MiB)
    _drop(path)
    with open(path, "rb") as fh:  # the first half warm, the second cold
        fh.read(100 * MiB)
    read: list[int] = []
    real = FilePool.handle

    def counting(self: FilePool, p: str) -> Any:
        handle = real(self, p)

        class Counted:
            def fileno(self) -> int | None:
                return handle.fileno()

            def read_into(self, offset: int, view: memoryview) -> int:
                read.append(len(view))
                return handle.read_into(offset, view)

        return Counted()

    monkeypatch.setattr(FilePool, "handle", counting)
    with FilePool(Source.at(tmp_path)) as pool:
        cal = calibrate(pool, {str(path): 200 * MiB})
        fd = pool.fd(str(path))
        assert fd is not None
        after = resident_fraction(fd)
    assert cal.probed and 0.4 <= cal.resident <= 0.6
    assert sum(read) <= PROBES * MiB + 2 * rates.READ_PROBE  # cold windows, and two passes of resident ones
    assert after == pytest.approx(cal.resident, abs=0.05)  # the cold windows it read were dropped again


def _cal(**kw: float) -> Calibration:
    base = Calibration(
        resident=1.0,
        cold_rate=4e8,
        cast_rate=2e9,
        read_rate=2e10,
        crc_rate=4e9,
        py_rate=cal_mod.PY_REF,
        reduce_rate=2e10,
        cores=16,
        load=0.0,
        seconds=0.0,
        probed=True,
    )
    return replace(base, **kw)


def test_the_model_follows_workers_cores_load_and_cache() -> None:
    job = Work(read=4 << 30, written=2 << 30, cast_elems=1 << 30)
    one, four, sixteen = (estimate_seconds(_cal(gil=False), w, job) for w in (1, 4, 16))
    assert one > four > sixteen  # every core counts without the GIL (with it, see the GIL's own test)
    assert estimate_seconds(_cal(cores=2), 16, job) == estimate_seconds(_cal(cores=2), 2, job)
    assert estimate_seconds(_cal(load=30.0, gil=False), 16, job) > sixteen  # a busy machine shares its cores
    assert estimate_seconds(_cal(resident=0.0, gil=False), 16, job) > sixteen  # from the disk
    assert estimate_seconds(_cal(resident=0.0), 16, job) >= (4 << 30) / (4e8 * cal_mod.STREAM_GAIN)


def test_the_model_is_its_arithmetic() -> None:
    """Each kind of work at its cost per byte in units of the read probe's rate, health's statistics in the
    reduction probe's, each zipped byte's CRC-32 at the CRC probe's, cast at the cast rate; the compute over the threads the pieces allow, the writes over the files written at once, a fresh page at the
    page probe's rate for every page new to the page cache; the disk's part
    overlapped, start-up serial; what else runs takes its share of the cores."""
    cal = _cal(cores=4, read_rate=1e10, crc_rate=2e9, cast_rate=1e9, page_rate=1e9, reduce_rate=3e10)
    work = Work(read=10**9, written=10**8, cast_elems=10**8, copied=2 * 10**8, zipped=10**8, reduced=10**9)
    page = cal_mod.PAGE_COST / 1e9  # seconds a fresh byte adds
    compute = (
        (cal_mod.READ_COST * 8 * 10**8 + cal_mod.ZIP_COST * 10**8) / 1e10
        + cal_mod.REDUCE_COST * 10**9 / 3e10
        + 10**8 / 2e9
        + 0.1
        + page * 10**8
    )
    writing = (cal_mod.WRITE_COST * 10**8 + cal_mod.COPY_COST * 2 * 10**8) / 1e10 + page * 3 * 10**8
    start = cal_mod.STARTUP_CPU
    assert estimate_seconds(cal, 1, work) == pytest.approx(start + compute + writing)
    assert estimate_seconds(cal, 8, work) == pytest.approx(start + (compute + writing) / 4)  # 4 cores
    pieces = replace(work, pieces=2)  # two files: two of the eight workers have work
    assert estimate_seconds(cal, 8, pieces) == pytest.approx(start + (compute + writing) / 2)
    one_file = replace(work, outputs=1)  # its writes take the file's lock in turn
    assert estimate_seconds(cal, 4, one_file) == pytest.approx(start + compute / 4 + writing)
    cold = replace(cal, resident=0.0, cold_rate=1e8 / cal_mod.STREAM_GAIN)  # the disk's 10 s outlast the CPU
    assert estimate_seconds(cold, 4, work) == pytest.approx(start + 10.0)
    serial = replace(work, overlapped=False)  # each worker reads, then works: the disk's time adds
    cold_compute = compute + page * 10**9  # every page the disk fills is a fresh one
    assert estimate_seconds(cold, 4, serial) == pytest.approx(start + (cold_compute + writing) / 4 + 10.0)
    assert estimate_seconds(cal, 4, serial) == estimate_seconds(cal, 4, work)  # warm: nothing to add
    ahead = replace(serial, read_ahead=True)  # the kernel reads the next window while the worker works
    assert estimate_seconds(replace(cold, read_ahead=True), 4, ahead) == pytest.approx(start + 10.0)
    assert estimate_seconds(cold, 4, ahead) == estimate_seconds(cold, 4, serial)  # not asked: warm enough
    busy = replace(cal, load=6.0)  # 6 others runnable on 4 cores: our 4 busy threads get 4 * 4 / 10 of them
    assert estimate_seconds(busy, 8, work) == pytest.approx(
        start / (4 / 7) + (compute + writing) / (4 * 4 / 10)
    )
    dearer = replace(cal, page_rate=5e8)  # fresh pages at half the rate: each new page's cost twice
    assert estimate_seconds(dearer, 1, work) == pytest.approx(start + compute + writing + page * 4 * 10**8)
    slow_python = replace(cal, py_rate=cal_mod.PY_REF / 2)  # start-up at the Python probe's rate
    assert estimate_seconds(slow_python, 1, work) == pytest.approx(2 * start + compute + writing)


def test_past_a_few_threads_the_gil_makes_more_workers_slower() -> None:
    """Under the GIL the threads past LOCAL_THREADS are worth fewer cores, as measured on 16 cores (every
    pass slower at 16 workers than at 4); without it (a free-threaded build) every core counts."""
    from inspector.system.limits import LOCAL_THREADS

    work = Work(read=4 << 30, written=2 << 30, cast_elems=1 << 30)
    cal = _cal(cores=16)
    few, many = (estimate_seconds(cal, n, work) for n in (LOCAL_THREADS, 16))
    assert many > few
    free = replace(cal, gil=False)
    assert estimate_seconds(free, 16, work) < estimate_seconds(free, LOCAL_THREADS, work) < few * 1.0001


def test_writes_past_the_freerun_point_go_at_the_disks_pace() -> None:
    """Output beyond the dirty pages the kernel lets a writer run free with is paced by the disk: the run
    takes at least (read from disk + written past that point) / the disk's streaming rate, and nothing
    changes while the output stays below it."""
    stream = 1e9
    cal = _cal(cores=16, read_rate=1e12, cold_rate=stream / cal_mod.STREAM_GAIN, freerun=2e9)
    small, big = Work(read=10**9, written=10**9), Work(read=10**9, written=6 * 10**9, zipped=2 * 10**9)
    start = cal_mod.STARTUP_CPU
    assert estimate_seconds(cal, 16, small) == estimate_seconds(replace(cal, freerun=math.inf), 16, small)
    assert estimate_seconds(cal, 16, big) == pytest.approx(start + (8e9 - 2e9) / stream)
    cold = replace(cal, resident=0.0)  # the disk reads the input too
    assert estimate_seconds(cold, 16, big) == pytest.approx(start + (1e9 + 6e9) / stream)


def test_the_cpu_probes_are_bounded_and_sane() -> None:
    """Each kind's rate is a positive, finite figure from a few milliseconds of its work, whatever state
    the page cache is in."""
    import time

    t = time.perf_counter()
    copy, pace = rates.copy_rate(), rates.Pace()
    pace.sample()
    assert time.perf_counter() - t < 1.0
    assert 1e8 < copy < 1e13 and 1e7 < pace.crc < 1e12 and 1e4 < pace.python < 1e10 and 1e5 < pace.cast < 1e12
    assert 1e8 < pace.reduce < 1e13
    assert rates.page_rate() > 1e6  # finite or not: a fresh page costs something or nothing measurable


def test_health_statistics_are_priced_in_the_reduction_probe() -> None:
    """Health's numpy passes run over its own buffers, not the page cache's pages: the reduction probe's
    rate moves their price, the read probe's only the reads (priced in the read probe, ZeRO-2's health said
    +35 to +48 % here while that probe followed the checkpoint's pages)."""
    work = Work(read=1 << 30, reduced=1 << 30, checked=1 << 28)
    base = _cal(gil=False)
    slow_numpy = estimate_seconds(replace(base, reduce_rate=base.reduce_rate / 2), 1, work)
    slow_reads = estimate_seconds(replace(base, read_rate=base.read_rate / 2), 1, work)
    alone = estimate_seconds(base, 1, work)
    numpy = (cal_mod.REDUCE_COST * work.reduced + cal_mod.CHECK_COST * work.checked) / base.reduce_rate
    reads = cal_mod.READ_COST * work.read / base.read_rate
    assert slow_numpy - alone == pytest.approx(numpy)
    assert slow_reads - alone == pytest.approx(reads)
    # a convert reduces nothing: the reduction probe prices none of it
    convert = Work(read=1 << 30, written=1 << 29, cast_elems=1 << 28)
    assert estimate_seconds(replace(base, reduce_rate=1.0), 1, convert) == estimate_seconds(base, 1, convert)


def test_the_read_probe_reads_resident_pages_and_no_more(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The read rate is a pread of the checkpoint's own resident pages, at most READ_PROBE bytes a pass
    (two passes); too few resident bytes give None (the copy probe's stand-in then)."""
    path = _file(tmp_path, 80 * MiB)
    path.read_bytes()  # resident
    read: list[int] = []
    with FilePool(Source.at(tmp_path)) as pool:
        handle = pool.handle(str(path))
        original = type(handle).read_into

        def counting(self: Any, offset: int, view: memoryview) -> Any:
            read.append(len(view))
            return original(self, offset, view)

        monkeypatch.setattr(type(handle), "read_into", counting)
        windows = [(str(path), o, MiB) for o in range(0, 80 * MiB, MiB)]
        rate = rates.read_rate(pool, windows)
        assert rate is not None and 1e8 < rate < 1e13
        assert sum(read) == 2 * rates.READ_PROBE  # two passes, bounded
        assert rates.read_rate(pool, windows[: rates.READ_MIN // MiB - 1]) is None
        cal = calibrate(pool, {str(path): 80 * MiB})
    assert cal.read_rate > 1e8 and cal.crc_rate > 1e7 and cal.py_rate > 1e4


def test_universal_uses_the_same_calibration(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Universal's preflight hands the one model the bytes it reads and what it does with them: read and
    zipped, the model-states files copied, `workers` files at once."""
    from inspector.convert.kinds import get, universal
    from inspector.convert.kinds.base import Request
    from inspector.convert.options import ConvertOptions
    from inspector.demo.writer import DemoSpec, write_demo
    from inspector.scan.scanner import scan

    write_demo(str(tmp_path / "ck"), DemoSpec(params=300_000))
    ckpt = scan(str(tmp_path / "ck"))
    seen: list[tuple[Mapping[str, int], Work, int]] = []
    real = cal_mod.calibrated_seconds

    def spy(sources: Any, reads: Mapping[str, int], work: Work, workers: int, *a: Any) -> float:
        seen.append((reads, work, workers))
        return real(sources, reads, work, workers, *a)

    monkeypatch.setattr(cal_mod, "calibrated_seconds", spy)
    monkeypatch.setattr(limits, "usable_cores", lambda: 64)  # as on a node of many cores
    # its 67 files of ~53 KB are written by one thread into a local OUT, the GIL's (SMALL_FILE), and by five
    # into a bucket (uploads); bigger ones by five
    small = get("universal").plan(ckpt, Request(ConvertOptions(workers=5)), str(tmp_path / "out"))
    assert (small.writers(None), small.writers(cast(Any, "a bucket"))) == (1, 5)
    assert small.assess().estimated_seconds > 0
    assert seen[-1][2] == 1  # preflight asks for what runs
    monkeypatch.setattr(universal, "SMALL_FILE", 1 << 10)
    job = get("universal").plan(ckpt, Request(ConvertOptions(workers=5)), str(tmp_path / "out"))
    assert job.writers(None) == 5
    assert job.assess().estimated_seconds > 0
    reads, work, workers = seen[-1]
    assert work.zipped == job.plan.tensor_bytes and work.pieces == len(job.plan.files) and workers == 5
    assert not work.overlapped  # a worker reads a chunk, then zips and writes it
    assert work.read_ahead  # but from a cold page cache the kernel reads the next window meanwhile
    assert work.files == len(job.plan.files) + len(job.plan.copies)  # each costs beyond its bytes
    assert work.read == sum(reads.values()) + work.copied


def test_preflight_uses_the_calibration(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """assess() asks calibrate() about the plan's own files (path -> bytes read from each)."""
    from inspector.convert.options import ConvertOptions
    from inspector.convert.plan import build_plan
    from inspector.convert.preflight import assess
    from inspector.demo.writer import DemoSpec, write_demo
    from inspector.scan.scanner import scan

    write_demo(str(tmp_path / "ck"), DemoSpec(params=300_000))
    plan = build_plan(scan(str(tmp_path / "ck")), ConvertOptions(dtype="bf16"))
    seen: list[Counter[str]] = []
    real = cal_mod.calibrate

    def spy(pool: FilePool, reads: Counter[str], cast: tuple[str, str]) -> Calibration:
        seen.append(reads)
        return real(pool, reads, cast)

    monkeypatch.setattr(cal_mod, "calibrate", spy)
    a = assess(plan, str(tmp_path / "out"))
    assert not seen  # nothing probed until the time is asked: convert asks only whether the run fits
    assert a.estimated_seconds > 0
    assert len(seen) == 1 and sum(seen[0].values()) == plan.read_bytes
    assert a.estimated_seconds > 0 and len(seen) == 1  # asked once, kept


def test_the_load_is_other_work_on_our_cpus(monkeypatch: pytest.MonkeyPatch) -> None:
    """The busy ticks of the CPUs we may use over the window, less our own CPU time; the runnable queue
    only when every CPU was busy (busy time cannot say how many share them); the load average only where
    /proc/stat cannot be read."""
    import io

    from inspector.system import cpuload

    # two CPUs, 20 ticks in the window: `busy` of them busy; `queued` runnable (us included) at each end
    def stat(busy: int, queued: int, t: int) -> bytes:
        lines = [b"cpu  0 0 0 0 0 0 0 0 0 0"]  # the aggregate line: not ours to read with an affinity
        for cpu in (0, 1):  # each CPU: at t=1, 10 ticks on, busy // 2 of them busy (user), the rest idle
            lines.append(b"cpu%d %d 0 0 %d 0 0 0 0 0 0" % (cpu, t * (busy // 2), t * (10 - busy // 2)))
        return b"\n".join([*lines, b"intr 0", b"procs_running %d" % queued, b""])

    def machine(busy: int, queued: int) -> None:
        reads = iter([stat(busy, queued, 0), stat(busy, queued, 1)])  # as the window starts and ends
        real_open = open

        def fake_open(path: Any, *a: Any, **kw: Any) -> Any:
            if path == "/proc/stat":
                return io.BytesIO(next(reads))
            return real_open(path, *a, **kw)

        monkeypatch.setattr("builtins.open", fake_open)

    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    monkeypatch.setattr(cpuload.time, "sleep", lambda s: None)
    monkeypatch.setattr(cpuload.time, "process_time", lambda: 0.0)
    machine(busy=10, queued=6)  # half the CPUs' time busy: one CPU's worth, whatever the queue said
    assert cpuload.others_busy(0.1) == pytest.approx(1.0)
    machine(busy=20, queued=6)  # both busy, five others runnable: they share the two with us
    assert cpuload.others_busy(0.1) == pytest.approx(5.0)
    machine(busy=20, queued=2)  # both busy, one other runnable: busy time says more
    assert cpuload.others_busy(0.1) == pytest.approx(2.0)
    # our own work run through the window (preflight's CPU probes) is not the others': one CPU of the two
    # busy, and all of it was ours
    own = iter([0.0, 0.1])
    monkeypatch.setattr(cpuload.time, "process_time", lambda: next(own))
    clock = iter([0.0, 0.04, 0.08, 0.12])
    monkeypatch.setattr(cpuload.time, "perf_counter", lambda: next(clock))
    calls: list[int] = []
    machine(busy=10, queued=1)
    assert cpuload.others_busy(0.1, meanwhile=lambda: calls.append(1)) == pytest.approx(0.0)
    assert len(calls) == 2  # until the window closed (at 0.1 s), instead of sleeping
    # both CPUs busy, one of them with our probes, three others runnable: they got the one CPU we left
    # them, but they are three CPUs of other work (the queue says so once the CPUs are all busy)
    own = iter([0.0, 0.1])
    clock = iter([0.0, 0.2])
    machine(busy=20, queued=4)
    assert cpuload.others_busy(0.1, meanwhile=lambda: None) == pytest.approx(3.0)
    monkeypatch.setattr(cpuload.time, "process_time", lambda: 0.0)

    def refused(path: Any, *a: Any, **kw: Any) -> Any:
        raise OSError("no /proc")

    monkeypatch.setattr("builtins.open", refused)
    monkeypatch.setattr(os, "getloadavg", lambda: (7.5, 0.0, 0.0))
    assert cpuload.others_busy(0.1) == 6.5


def test_the_load_sees_a_busy_cpu() -> None:
    """A real process spinning on one of our CPUs counts as about one CPU of other work. Other tests run
    beside this one (xdist) and come and go between the quiet and the busy sample, so the pair is taken up to
    three times: the spinner must show in one of them (it failed once in a -n 2 run when a neighbour went
    idle between the two samples)."""
    import subprocess
    import sys
    import time

    from inspector.system.cpuload import others_busy

    cap = len(os.sched_getaffinity(0)) * 0.9
    seen = []
    for _ in range(3):
        quiet = others_busy(0.2)
        spin = subprocess.Popen([sys.executable, "-c", "while True: pass"])
        try:
            time.sleep(0.3)
            busy = others_busy(0.2)
        finally:
            spin.kill()
            spin.wait()
        seen.append((quiet, busy))
        if busy >= min(quiet + 0.5, cap):
            return
    raise AssertionError(f"a spinning process never showed in the load (quiet, busy): {seen}")


def _works() -> dict[str, Work]:
    """The shapes the three commands hand the model: convert (cast, written into the shards), universal
    (read, zipped, one worker per file, read ahead when cold) and health (read and reduced)."""
    g = 1 << 30
    return {
        "convert": Work(read=g, written=g // 2, cast_elems=g // 4, outputs=1),
        "universal": Work(read=3 * g, zipped=3 * g, pieces=300, overlapped=False, read_ahead=True),
        "health": Work(read=3 * g, reduced=3 * g, pieces=200, read_ahead=True),
    }


def _machines() -> list[Calibration]:
    """Calibrations from a quiet laptop to a busy node, warm, half and cold, read ahead or not, fresh pages
    free or not."""
    out = []
    for cores, load, resident, page in itertools.product(
        (1, 2, 16, 96), (0.0, 1.5, 40.0), (1.0, 0.5, 0.0), (math.inf, 4e8, 4e10)
    ):
        out.append(_cal(cores=cores, load=load, resident=resident, read_ahead=resident < 0.5, page_rate=page))
    return out


def test_more_workers_never_predict_slower_nor_below_the_floor() -> None:
    """Each worker more predicts no slower (up to LOCAL_THREADS under the GIL, every worker count without
    it), and never faster than the floor: the bytes the disk serves at its streaming rate, the read out of
    the page cache on every core there is, the start-up."""
    from inspector.system.limits import LOCAL_THREADS

    for cal, (name, work) in itertools.product(_machines(), _works().items()):
        counts = [n for n in (1, 2, 3, 4, 8, 16, 64, 128)]
        free = [estimate_seconds(replace(cal, gil=False), n, work) for n in counts]
        assert all(b <= a for a, b in itertools.pairwise(free)), (name, cal, free)
        held = [estimate_seconds(cal, n, work) for n in counts if n <= LOCAL_THREADS]
        assert all(b <= a for a, b in itertools.pairwise(held)), (name, cal, held)
        times = [estimate_seconds(cal, n, work) for n in counts]
        disk = work.read * (1.0 - cal.resident) / (cal.cold_rate * cal_mod.STREAM_GAIN)
        copy = cal_mod.READ_COST * (work.read - work.copied) / cal.read_rate / cal.cores
        assert times[-1] >= cal_mod.STARTUP_CPU + max(disk, copy), (name, cal)


def test_a_cold_page_cache_never_predicts_faster() -> None:
    """Bytes the disk serves cost what cached ones do and a fresh page besides: colder is never faster
    (slower wherever a fresh page costs anything), for every command, worker count and machine, the
    run's read-ahead decision held. (Across that decision it may be: universal half cold reads without
    advice, in turn, and a colder run asked ahead overlaps; the model follows the run's own test.)"""
    for cal, (name, work), n, ahead in itertools.product(
        _machines(), _works().items(), (1, 2, 16), (False, True)
    ):
        if cal.resident == 1.0:
            warm, half, cold = (replace(cal, resident=r, read_ahead=ahead) for r in (1.0, 0.5, 0.0))
            seconds = [estimate_seconds(c, n, work) for c in (warm, half, cold)]
            assert seconds[0] <= seconds[1] <= seconds[2], (name, cal, n)
            if cal.page_rate < math.inf:  # fresh pages cost: the disk's pages cost CPU
                assert seconds[0] < seconds[2], (name, cal, n)


def test_universal_read_ahead_overlaps_the_disk_with_the_cpu() -> None:
    """Universal's workers read, then zip: with nothing asked ahead the disk's time adds to the CPU's;
    from a cold cache its reads are asked ahead and the two overlap (the slower of them, not the sum)."""
    work = _works()["universal"]
    cold = _cal(cores=2, resident=0.0, cold_rate=2e8)
    serial, ahead = estimate_seconds(cold, 2, work), estimate_seconds(replace(cold, read_ahead=True), 2, work)
    compute, _ = cal_mod.cpu_seconds(cold, work)
    disk = work.read / (cold.cold_rate * cal_mod.STREAM_GAIN)
    assert serial == pytest.approx(cal_mod.STARTUP_CPU + compute / 2 + disk)
    assert ahead == pytest.approx(cal_mod.STARTUP_CPU + max(compute / 2, disk)) and ahead < serial


def test_many_small_files_cost_more_than_their_bytes() -> None:
    """The same bytes in ten times the files take longer, by FILE_COST a file on one thread whatever the
    workers (a file's Python holds the GIL)."""
    cal, work = _cal(cores=2), _works()["universal"]
    few, many = replace(work, files=300), replace(work, files=3000)
    extra = 2700 * cal_mod.FILE_COST / cal.py_rate
    assert estimate_seconds(cal, 2, many) == pytest.approx(estimate_seconds(cal, 2, few) + extra)


def test_the_calibration_takes_the_runs_own_read_ahead_decision(tmp_path: Path) -> None:
    """`Calibration.read_ahead` is what the run will decide (`FilePool.mostly_cold`, same files): asked
    from a cold page cache, not from a warm one."""
    path = _file(tmp_path, 64 * MiB)
    with FilePool(Source.at(tmp_path)) as pool:
        _drop(path)
        assert calibrate(pool, {str(path): 64 * MiB}).read_ahead
        path.read_bytes()
        assert not calibrate(pool, {str(path): 64 * MiB}).read_ahead


def test_each_read_and_the_scan_the_run_repeats_cost_their_share() -> None:
    """A checkpoint of many ranks is read a parameter a rank: each read costs RANGE_COST on one thread (its
    Python holds the GIL), and the scan the run repeats before its first byte (measured by this process)
    adds to the start-up."""
    cal, work = _cal(cores=2), Work(read=1 << 26, written=1 << 25, cast_elems=1 << 24)
    few, many = replace(work, ranges=354), replace(work, ranges=39_705)
    extra = (39_705 - 354) * cal_mod.RANGE_COST / cal.py_rate
    assert estimate_seconds(cal, 2, many) == pytest.approx(estimate_seconds(cal, 2, few) + extra)
    scanned = replace(work, startup=1.5)  # serial, before the workers start
    assert estimate_seconds(cal, 2, scanned) == pytest.approx(estimate_seconds(cal, 2, work) + 1.5)


def test_reads_are_counted_as_the_reader_merges_them(tmp_path: Path) -> None:
    """`reads_of` counts one read for each run `read_segments_into` issues: adjacent segments of one file
    merge, a gap or another file starts a new read."""
    import numpy as np

    from inspector.convert.reader import read_segments_into, reads_of
    from inspector.scan.model import Segment

    for name in ("a", "b"):
        (tmp_path / name).write_bytes(bytes(range(256)) * 4)
    segs = [
        Segment("a", 0, 4, "float32"),
        Segment("a", 16, 4, "float32"),  # adjacent: merged
        Segment("a", 64, 2, "float32"),  # a gap
        Segment("b", 72, 2, "float32"),  # another file
        Segment("a", 72, 2, "float32"),  # back to a, adjacent to its last read but not to the run before
    ]
    issued: list[int] = []
    with FilePool(Source(str(tmp_path))) as pool:
        real = pool.read_runs
        pool.read_runs = lambda runs: (issued.append(len(runs)), real(runs))[1]  # type: ignore[method-assign]
        read_segments_into(pool, segs, np.empty(14, np.float32))
    counts, ranges = reads_of(segs)
    assert ranges == sum(issued) == 4
    assert counts == Counter({"a": 48, "b": 8})


def test_the_scan_says_what_it_cost(tmp_path: Path) -> None:
    """`scan` records its own CPU-seconds on the checkpoint, and the plans carry it to preflight."""
    from inspector.convert.options import ConvertOptions
    from inspector.convert.plan import build_plan
    from inspector.demo.writer import DemoSpec, write_demo
    from inspector.scan.scanner import scan

    write_demo(str(tmp_path / "ck"), DemoSpec(params=300_000, world_size=4))
    ckpt = scan(str(tmp_path / "ck"))
    assert 0.0 < ckpt.scan_cpu < 60.0
    assert build_plan(ckpt, ConvertOptions(dtype="bf16")).scan_cpu == ckpt.scan_cpu
