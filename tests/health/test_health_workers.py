"""How the pass is spread over workers and what one worker holds: threads from the usable cores (more from a
store), chunks shrunk to keep every worker's buffers in one budget, and the slow float64 comparisons run a
bounded block at a time, so a chunk full of NaN (a diverged run) costs no more memory than a sound one."""

from __future__ import annotations

import math
import threading
import tracemalloc
from collections.abc import Callable
from typing import Any

import ml_dtypes
import numpy as np
import pytest

from inspector.health import chunk_math, numerics, stream
from inspector.health.chunk_math import Scratch
from inspector.health.numerics import EXACT_BLOCK, Accumulator, Buffers
from inspector.health.stream import (
    CHUNK_ELEMS,
    MIN_CHUNK,
    SCRATCH_BUDGET,
    Streamer,
    WorkerPlan,
    _worker_bytes,
    max_threads,
    plan_workers,
)
from inspector.system import limits
from inspector.system.limits import REMOTE_THREADS, busy_threads

N = 3 * EXACT_BLOCK + 1234  # several of the slow paths' blocks and a tail


@pytest.mark.parametrize("against", [False, True])
@pytest.mark.parametrize("workers", [1, 2, 3, 4, 5, 7, 8, 12, 16, 64, 96, 1024])
def test_more_workers_never_mean_more_memory(workers: int, against: bool) -> None:
    """One budget divided among the workers: whatever their number, their buffers fit it, chunks stay a
    power-of-two multiple of MIN_CHUNK (so the figures' groups never move), and more workers than the
    budget holds at MIN_CHUNK run as that many."""
    for remote in (False, True):
        plan = plan_workers(workers, against, remote)
        assert plan.threads == min(limits.workers(workers, remote), max_threads(against))
        assert plan.threads <= busy_threads(workers, remote)
        chunk, threads = plan.chunk, plan.threads
        assert MIN_CHUNK <= chunk <= CHUNK_ELEMS and chunk % MIN_CHUNK == 0 and chunk & (chunk - 1) == 0
        assert threads * _worker_bytes(chunk, against) <= SCRATCH_BUDGET
        if chunk < CHUNK_ELEMS:  # halved only as far as needed
            assert threads * _worker_bytes(2 * chunk, against) > SCRATCH_BUDGET


def test_the_budget_holds_sixteen_workers_at_a_mebibyte(monkeypatch: pytest.MonkeyPatch) -> None:
    """On a 64-core node without the GIL (where 16 threads do run side by side)."""
    monkeypatch.setattr(limits, "usable_cores", lambda: 64)
    monkeypatch.setattr(limits, "gil_enabled", lambda: False)
    assert max_threads() >= 16
    assert plan_workers(16) == WorkerPlan(16, MIN_CHUNK)


def test_locally_no_more_threads_than_cores(monkeypatch: pytest.MonkeyPatch) -> None:
    """A thread beyond the cores only reads ahead of a free one (its chunk leaves the caches first): 16
    workers on 2 cores run as 2, with 2's chunk, with the GIL or without; from a store every thread waits
    on its own request."""
    monkeypatch.setattr(limits, "usable_cores", lambda: 2)
    for gil in (True, False):
        monkeypatch.setattr(limits, "gil_enabled", lambda g=gil: g)
        assert plan_workers(16) == plan_workers(2) == WorkerPlan(2, plan_workers(2).chunk)
        assert plan_workers(16, remote=True).threads == 16


def test_workers_follow_the_usable_cores(monkeypatch: pytest.MonkeyPatch) -> None:
    """The usable cores up to LOCAL_THREADS on local files, asked or not (past a few, Python threads only
    wait on each other's GIL: on 16 cores 16 took 2.6-3.2 times 4's time), every core and at least
    REMOTE_THREADS from a store, where an explicit number is honoured."""
    monkeypatch.setattr(limits.sys, "_is_gil_enabled", lambda: True, raising=False)  # as on every GIL build
    for cores, local, remote in [
        (1, 1, REMOTE_THREADS),
        (3, 3, REMOTE_THREADS),
        (6, 4, REMOTE_THREADS),
        (64, 4, 64),
    ]:
        monkeypatch.setattr(limits, "usable_cores", lambda c=cores: c)
        assert (limits.workers(), limits.workers(remote=True)) == (local, remote), cores
        assert limits.workers(16) == min(16, cores, limits.LOCAL_THREADS), cores
        assert limits.workers(3) == min(3, cores), cores
        assert limits.workers(16, remote=True) == 16, cores


def test_without_the_gil_every_core_works(monkeypatch: pytest.MonkeyPatch) -> None:
    """LOCAL_THREADS caps the default because threads take turns at the GIL; a free-threaded interpreter
    running without it gets every usable core."""
    monkeypatch.setattr(limits, "usable_cores", lambda: 16)
    monkeypatch.setattr(limits.sys, "_is_gil_enabled", lambda: False, raising=False)
    assert limits.workers() == limits.workers(16) == 16
    assert limits.workers(64) == 16  # still no more than the cores
    monkeypatch.setattr(limits.sys, "_is_gil_enabled", lambda: True, raising=False)
    assert limits.workers() == limits.workers(16) == limits.LOCAL_THREADS


def _reference_diff(master: np.ndarray[Any, Any], module: np.ndarray[Any, Any]) -> tuple[float, int]:
    """Largest |module - bf16(master)| and how many differ, elementwise in float64 (NaN on both sides is no
    difference, on one side an infinite one)."""
    a = module.astype(np.float64)
    b = master.astype(ml_dtypes.bfloat16).astype(np.float64)
    both = np.isnan(a) & np.isnan(b)
    d = np.abs(a - b)
    d[np.isnan(d)] = math.inf
    d[both] = 0.0
    return (float(d.max()), int(np.count_nonzero(d)))


def test_module_copy_compared_block_by_block_with_nan_in_the_master() -> None:
    rng = np.random.default_rng(3)
    master = (0.02 * rng.standard_normal(N)).astype(np.float32)
    master[[7, EXACT_BLOCK + 5, N - 1]] = np.nan  # NaN in several blocks: the NaN-aware cast
    module = master.astype(ml_dtypes.bfloat16)
    module[2 * EXACT_BLOCK + 9] = ml_dtypes.bfloat16(3.0)  # one drifted value, in a block with no NaN
    module[EXACT_BLOCK + 5] = ml_dtypes.bfloat16(1.0)  # a NaN the copy does not hold: infinitely far
    s = Scratch(N)
    got = chunk_math.module_diff(master, module, s, finite=False)
    assert got == _reference_diff(master, module) == (math.inf, 2)
    module[EXACT_BLOCK + 5] = ml_dtypes.bfloat16(np.nan)
    assert chunk_math.module_diff(master, module, s, finite=False) == _reference_diff(master, module)
    assert _reference_diff(master, module)[1] == 1


def test_a_change_with_nan_and_inf_summed_block_by_block() -> None:
    rng = np.random.default_rng(4)
    then = rng.standard_normal(N).astype(np.float32)
    now = then + np.float32(1e-3) * rng.standard_normal(N).astype(np.float32)
    then[[3, 2 * EXACT_BLOCK]] = now[[3, 2 * EXACT_BLOCK]] = np.nan  # NaN before and after: no change
    now[EXACT_BLOCK + 1] = np.inf  # appeared since: an infinite change
    got = sum(chunk_math.delta_sq(now, then, Scratch(N)))
    assert got == math.inf
    now[EXACT_BLOCK + 1] = then[EXACT_BLOCK + 1]
    d = now.astype(np.float64) - then.astype(np.float64)
    d[[3, 2 * EXACT_BLOCK]] = 0.0
    assert sum(chunk_math.delta_sq(now, then, Scratch(N))) == pytest.approx(float(d @ d), rel=1e-5)


def test_a_chunk_of_nan_allocates_no_more_than_a_block() -> None:
    """The exact path's temporaries (NaN and Inf masks, the finite values' copy) are one EXACT_BLOCK's, not
    one chunk's: a 512 Ki chunk of NaN would otherwise allocate about 5 MiB more per worker."""
    chunk = 1 << 19
    x = np.full(chunk, np.nan, np.float32)
    x[::3] = 1.5
    buf, acc = Buffers(chunk), Accumulator(row=1000)
    acc.add(x[:1000], buf)  # the first call's small allocations out of the way
    tracemalloc.start()
    try:
        acc.add(x, buf)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 12 * EXACT_BLOCK, peak  # a few bytes per element of one block, not of the chunk
    st = acc.result()
    assert st.nan == chunk + 1000 - st.finite and st.minimum == st.maximum == 1.5


def _tied(
    n: int, ties: np.ndarray[Any, Any], seed: int
) -> tuple[np.ndarray[Any, Any], Buffers, Callable[[np.ndarray[Any, Any]], bool]]:
    """A finite fp32 master of random bits whose low halves are ties (0x8000) at `ties`, the buffers, and the
    check of a bf16 copy against it (the copy widened into the buffers first, as the pass does; the check
    is given a copy of the master, whose bytes it may spend)."""
    rng = np.random.default_rng(seed)
    bits = rng.integers(0, 2**32, n, dtype=np.uint64).astype(np.uint32)
    bits[ties] = (bits[ties] & 0xFFFF0000) | 0x8000
    master = bits.view(np.float32).copy()
    master[~np.isfinite(master)] = 1.5
    buf = Buffers(n)

    def check(module: np.ndarray[Any, Any]) -> bool:
        np.left_shift(module.view(np.uint16), 16, out=buf.wide[:n].view(np.uint32), dtype=np.uint32)
        return chunk_math.rounds_to(master.copy(), module, buf)

    return master, buf, check


def test_the_bf16_copy_check_without_a_cast_agrees_with_the_cast() -> None:
    """`_rounds_to` (integer passes that release the GIL) says a bf16 copy is its fp32 master rounded to
    nearest even exactly when ml_dtypes' cast (torch's rounding for finite values) gives the same bits: ties
    either way, a sign flipped at zero, a drifted value, an overflow to Inf."""
    n = 1 << 16
    master, buf, check = _tied(n, np.arange(0, n, 97), 11)  # ties, half of them rounding up
    master[:4] = [0.0, -0.0, np.finfo(np.float32).max, -np.finfo(np.float32).max]
    good = master.astype(ml_dtypes.bfloat16)
    assert check(good)
    for i, value in [(0, -0.0), (1, 0.0), (500, None), (97 * 3, None), (2, 0.0)]:
        bad = good.copy()
        if value is None:  # the neighbour: one ulp off, the other way at a tie
            bad.view(np.uint16)[i] ^= 1
        else:
            bad[i] = value
        assert not np.array_equal(bad.view(np.uint16), good.view(np.uint16))
        assert not check(bad), i
    # a chunk without a tie (the first tie left is at 97): a zero whose sign flipped is the wrapped -2**31
    k = 90
    head = master[:k]
    flipped = good[:k].copy()
    flipped[1] = 0.0  # -0.0 in the master
    for module, expect in [(good[:k], True), (flipped, False)]:
        np.left_shift(module.view(np.uint16), 16, out=buf.wide[:k].view(np.uint32), dtype=np.uint32)
        assert chunk_math.rounds_to(head.copy(), module, buf) is expect


def test_the_copy_check_gives_the_master_back_where_the_copy_differs() -> None:
    """The check takes its difference in place over the master's bits: where the copy is not the master
    rounded, the master is given back bit for bit (the comparison that measures the difference reads it),
    whatever the difference (a drifted value, a flipped sign at zero, a NaN in the copy, an Inf); where the
    copy is exact, its bytes are spent."""
    n = 4096 * 3 + 17
    master, buf, _ = _tied(n, np.arange(0, n, 301), 3)
    master[:2] = [0.0, -0.0]
    good = master.astype(ml_dtypes.bfloat16)
    for i, value in [(5, None), (0, -0.0), (n - 1, np.nan), (4096, np.inf)]:
        bad = good.copy()
        if value is None:
            bad.view(np.uint16)[i] ^= 1
        else:
            bad[i] = value
        np.left_shift(bad.view(np.uint16), 16, out=buf.wide[:n].view(np.uint32), dtype=np.uint32)
        spent = master.copy()
        assert not chunk_math.rounds_to(spent, bad, buf), i
        assert np.array_equal(spent.view(np.uint32), master.view(np.uint32)), i
    np.left_shift(good.view(np.uint16), 16, out=buf.wide[:n].view(np.uint32), dtype=np.uint32)
    spent = master.copy()
    assert chunk_math.rounds_to(spent, good, buf)
    assert not np.array_equal(spent.view(np.uint32), master.view(np.uint32))


@pytest.mark.parametrize(
    ("n", "every"),
    [(4096 * 3 + 33, 5000), (4096 * 80 + 33, 97), (4096 * 2, 4096 * 2 + 1), (100, 7)],
    ids=["few tied rows and a tail", "more tied rows than are searched one by one", "one tie", "short"],
)
def test_the_tie_search_finds_every_tie_that_rounds_the_wrong_way(n: int, every: int) -> None:
    """The maximum is taken row by row and only rows whose maximum is a tie are searched: a copy whose tie
    went odd is refused wherever that tie lies (a tied row, the tail, past the rows searched one by one), and
    the copy rounded right is accepted."""
    ties = np.unique(np.r_[np.arange(every // 2, n, every), n - 5])  # and one in the tail
    master, _, check = _tied(n, ties, n)
    good = master.astype(ml_dtypes.bfloat16)
    assert check(good)
    tied = [int(i) for i in ties if (master.view(np.uint32)[i] & 0xFFFF) == 0x8000]
    assert tied
    for i in {tied[0], tied[len(tied) // 2], tied[-1]}:
        bad = good.copy()
        b = bad.view(np.uint16)
        up = (master.view(np.uint32)[i] & 0x7FFFFFFF) > (int(b[i]) & 0x7FFF) << 16  # above its copy
        b[i] = b[i] + 1 if up else b[i] - 1  # the neighbour on the master's other side: as near, and odd
        assert b[i] & 1 and not check(bad), i


def test_no_more_chunks_reduced_at_once_than_usable_cores(demo: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Eight threads on one usable core (as from an object store, where each waits on its own requests)
    read side by side but reduce one chunk at a time (reducing on more threads than cores only thrashed the
    caches), and give the figures one worker gives."""

    from inspector.demo.writer import DemoSpec
    from inspector.health import run_check
    from inspector.scan.scanner import scan

    ckpt = scan(str(demo(DemoSpec(stage=2, world_size=2, params=400_000))))
    one = run_check(ckpt, workers=1).as_json()
    monkeypatch.setattr(stream, "usable_cores", lambda: 1)
    monkeypatch.setattr(limits, "usable_cores", lambda: 64)
    monkeypatch.setattr(limits, "gil_enabled", lambda: False)  # so that 8 local threads run
    most = _most_reducing_at_once(monkeypatch, 0.002)
    eight = run_check(ckpt, workers=8)
    assert eight.threads == 8 and most[0] == 1
    doc = eight.as_json()
    for d in (doc, one):
        d.pop("seconds"), d.pop("threads")
    assert doc == one


def test_a_proven_copy_is_measured_from_its_masters_bounds() -> None:
    """A bf16 copy proven to be its master rounded is given the master's (min, max) rounded instead of two
    passes of its own: the figures are the same bits as the copy measured alone; a bound that rounds to Inf
    or to zero is not handed over (the copy's own passes choose a zero's sign)."""
    rng = np.random.default_rng(5)
    n = 1 << 16
    cases = {
        "normal": rng.standard_normal(n).astype(np.float32),
        "ties": ((rng.integers(1, 2**15, n).astype(np.uint32) << 16) | 0x8000).view(np.float32),
        "near max": np.full(n, np.finfo(np.float32).max, np.float32)
        * rng.uniform(0.5, 1.0, n).astype(np.float32),
        "tiny": (rng.standard_normal(n) * 1e-41).astype(np.float32),
        "positive": np.abs(rng.standard_normal(n)).astype(np.float32) + 1.0,
    }
    for name, master in cases.items():
        copy = master.astype(ml_dtypes.bfloat16)
        lo, hi = float(master.min()), float(master.max())
        bounds = chunk_math.rounded_bounds((lo, hi))
        own_lo, own_hi = float(copy.astype(np.float32).min()), float(copy.astype(np.float32).max())
        if bounds is None:
            assert not (np.isfinite(own_lo) and np.isfinite(own_hi)) or own_lo == 0.0 or own_hi == 0.0, name
            continue
        assert bounds == (own_lo, own_hi), name
        alone, given = Accumulator(), Accumulator()
        alone.add(copy, Buffers(n))
        buf = Buffers(n)
        wide = numerics.widened(copy, buf)
        assert wide is not None
        given.add(wide, buf, bounds)
        assert alone.result() == given.result(), name
    assert chunk_math.rounded_bounds((0.0, 1.0)) is None  # zero: the copy's own passes
    assert chunk_math.rounded_bounds((1.0, float(np.finfo(np.float32).max))) is None  # rounds to Inf


class _Advised:
    """A FilePool stand-in that records advice."""

    remote = False

    def __init__(self) -> None:
        self.calls: list[tuple[str, int, int]] = []

    def advise(self, path: str, offset: int, nbytes: int) -> None:
        self.calls.append((path, offset, nbytes))


def test_each_chunk_is_advised_ahead_of_its_read() -> None:
    """With `ahead` chunks, a chunk's ranges (every stream's) are handed to the kernel before the chunk
    `ahead` places earlier is yielded to be read; the chunks come out in order, none lost; without it,
    no advice at all."""
    from inspector.scan.model import Segment

    chunks = [([Segment("m", 4 * k, 1, "float32")], [Segment("c", 2 * k, 1, "bfloat16")]) for k in range(5)]
    for ahead in (0, 1, 3):
        pool = _Advised()
        streamer = Streamer(pool, threading.Event(), ahead=ahead)  # type: ignore[arg-type]
        seen = []
        for item in streamer._ahead_of(iter(chunks)):
            k = len(seen)
            # every chunk up to `ahead` past this one was advised (fewer near the end), both streams
            assert len(pool.calls) == 2 * min(len(chunks), k + 1 + ahead) if ahead else not pool.calls
            seen.append(item)
        assert seen == chunks
        if ahead:
            assert pool.calls[:2] == [("m", 0, 4), ("c", 0, 2)]


def test_read_ahead_only_for_a_cold_local_pass(demo: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Advice is asked for when most of what the pass reads is not in the page cache, never for cached
    files (it only costs there) nor from an object store; either way the figures are the same bits."""
    import os
    import sys

    from inspector.convert.reader import FilePool
    from inspector.demo.writer import DemoSpec
    from inspector.health import run_check
    from inspector.health.check import _selected
    from inspector.scan.scanner import scan
    from inspector.system.residency import sample_windows

    ckpt = scan(str(demo(DemoSpec(stage=2, world_size=2, params=400_000))))
    jobs = stream.plan_jobs(ckpt, _selected(ckpt, (), ()), None)
    files = {s.file for j in jobs for s in (*j.segments, *j.module)}
    for f in files:  # cached: read every byte
        with open(f, "rb") as fh:
            while fh.read(1 << 20):
                pass
    with FilePool(ckpt.source) as pool:
        assert stream.read_ahead(pool, jobs) == 0
        for f in files:  # written back first: the kernel drops only clean pages
            fd = os.open(f, os.O_RDONLY)
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            os.close(fd)
        fd = pool.fd(max(files, key=os.path.getsize))
        windows = sample_windows(fd) if fd is not None else None
        if windows is None or sum(f for _, _, f in windows) / len(windows) > 0.5:
            pytest.skip("this file system keeps the pages (tmpfs, say): nothing to read ahead")
        assert stream.read_ahead(pool, jobs) == stream.READ_AHEAD
        monkeypatch.setattr(type(pool), "remote", property(lambda self: True))
        assert stream.read_ahead(pool, jobs) == 0
    monkeypatch.undo()
    runs = []
    for ahead in (0, 2):
        checking = sys.modules["inspector.health.check"]  # the package's `check` is the function
        monkeypatch.setattr(checking, "read_ahead", lambda pool, units, by_file=None, a=ahead: a)
        doc = run_check(ckpt, workers=2).as_json()
        doc.pop("seconds")
        runs.append(doc)
    assert runs[0] == runs[1]


def test_under_the_gil_no_more_chunks_reduced_at_once_than_the_ceiling(
    demo: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Eight threads on sixteen cores (as from an object store, where each waits on its own requests) reduce
    at most LOCAL_THREADS chunks at once while Python has a GIL: past it their numpy calls' handoffs are the
    pass (16 threads took 2.6-3.2 times 4's time on 16 cores)."""

    from inspector.demo.writer import DemoSpec
    from inspector.health import run_check
    from inspector.scan.scanner import scan

    ckpt = scan(str(demo(DemoSpec(stage=2, world_size=2, params=400_000))))
    monkeypatch.setattr(stream, "usable_cores", lambda: 16)
    monkeypatch.setattr(stream, "gil_enabled", lambda: True)
    monkeypatch.setattr(limits, "usable_cores", lambda: 16)
    monkeypatch.setattr(limits, "gil_enabled", lambda: False)  # so that 8 local threads run, as from a store
    most = _most_reducing_at_once(monkeypatch, 0.005)
    report = run_check(ckpt, workers=8)
    assert report.threads == 8 and 1 < most[0] <= limits.LOCAL_THREADS, most


def _most_reducing_at_once(monkeypatch: pytest.MonkeyPatch, linger: float) -> list[int]:
    """[the most chunks reduced at once], kept up to date while the test runs: each chunk's reduction held
    `linger` seconds, long enough for the other workers to arrive if they may."""
    import threading
    import time

    busy, most, lock = [0], [0], threading.Lock()
    add = Accumulator.add

    def counted(self: Accumulator, x: Any, buf: Buffers, bounds: Any = None) -> bool:
        with lock:
            busy[0] += 1
            most[0] = max(most[0], busy[0])
        time.sleep(linger)
        try:
            return add(self, x, buf, bounds)
        finally:
            with lock:
                busy[0] -= 1

    monkeypatch.setattr(Accumulator, "add", counted)
    return most
