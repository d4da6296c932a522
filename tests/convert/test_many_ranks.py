"""Thousands of ranks (issue 43): a 4,096-rank ZeRO-3 save is 8,192 files. Scan and convert read every one,
bit-exact, with the descriptors they hold bounded by the reader's pool (far below `ulimit -n`, whatever the
rank count), and the stage-3 records of the other ranks kept slim. Counted and compared, never timed."""

from __future__ import annotations

import os
import resource
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from inspector.convert.options import ConvertOptions
from inspector.convert.plan import build_plan
from inspector.convert.reader import FilePool, open_cap
from inspector.demo.writer import DemoSpec, write_demo
from inspector.scan.model import Severity
from inspector.scan.scanner import scan
from inspector.system.source import Source
from tests.convert.jobs import execute
from tests.convert.test_convert_end_to_end import assert_matches_expected

WIDE = DemoSpec(stage=3, world_size=4096, dtype="bf16", params=20_000)


@pytest.fixture
def low_nofile() -> Iterator[int]:
    """The common default `ulimit -n` of 1,024 for the test's duration: below the save's 8,192 files."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    low = min(1024, hard) if hard != resource.RLIM_INFINITY else 1024
    resource.setrlimit(resource.RLIMIT_NOFILE, (low, hard))
    try:
        yield low
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def open_descriptors() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.mark.slow  # 8,192 files written and read: tox -e slow
@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="counts descriptors through /proc")
def test_a_4096_rank_save_scans_and_converts_bit_exact_within_1024_descriptors(
    tmp_path: Path, low_nofile: int
) -> None:
    write_demo(str(tmp_path / "ckpt"), WIDE)
    ckpt = scan(str(tmp_path / "ckpt"))
    assert ckpt.world_size == 4096 and ckpt.stage == 3
    assert not [f for f in ckpt.findings if f.severity is Severity.ERROR], ckpt.findings
    assert len(ckpt.files) == 2 * 4096
    # every trainable tensor is split over the ranks that hold a slice of it
    assert max(len(t.segments) for t in ckpt.tensors) > 1000
    plan = build_plan(ckpt, ConvertOptions(dtype="bf16", chunk_elems=4096))
    before = open_descriptors()
    peak = [before]
    done = threading.Event()

    def watch() -> None:  # descriptors open while the conversion runs, sampled
        while not done.wait(0.002):
            peak[0] = max(peak[0], open_descriptors())

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        execute(plan, str(tmp_path / "out"))
    finally:
        done.set()
        watcher.join()
    assert_matches_expected(WIDE, plan, tmp_path / "out")
    assert peak[0] - before <= open_cap() + 32 < low_nofile
    assert open_descriptors() <= before + 1  # the pool closed what it opened


def test_the_pool_closes_a_file_no_read_is_using_to_stay_within_its_cap(tmp_path: Path) -> None:
    for i in range(12):
        (tmp_path / f"f{i}").write_bytes(bytes([i]) * 64)
    buf = bytearray(8)
    with FilePool(Source.at(str(tmp_path)), cap=4) as pool:
        with pool.using(str(tmp_path / "f0")) as held:
            for i in range(1, 12):
                pool.read_into(str(tmp_path / f"f{i}"), 8, memoryview(buf))
                assert bytes(buf) == bytes([i]) * 8
                assert pool.open_count <= 4 + 1  # the cap, and f0 while a read holds it
            assert held.read_into(0, memoryview(buf)) == 8 and bytes(buf) == b"\0" * 8  # still open
        for i in (0, 11, 3, 7):  # reopened on demand after being closed for room
            pool.read_into(str(tmp_path / f"f{i}"), 0, memoryview(buf))
            assert bytes(buf) == bytes([i]) * 8
        assert pool.open_count <= 4
    assert pool.open_count == 0


@pytest.mark.parametrize("files", [4, 12, 40])
def test_sweeps_over_more_files_than_the_cap_reopen_only_what_it_cannot_hold(
    tmp_path: Path, files: int
) -> None:
    """A stripe reads every rank's file, stripe after stripe: past the first sweep, a pool of `cap` files
    opens only the files beyond what it holds (closing the least recently used one would reopen them all)."""
    from inspector.convert import filepool

    cap, sweeps = 4, 5
    for i in range(files):
        (tmp_path / f"f{i}").write_bytes(bytes([i]) * 16)
    opened: list[str] = []
    real = filepool.open_handle_in

    def counting(path: str, sources: object) -> object:
        opened.append(path)
        return real(path, sources)  # type: ignore[arg-type]

    with FilePool(Source.at(str(tmp_path)), cap=cap) as pool, pytest.MonkeyPatch.context() as m:
        m.setattr(filepool, "open_handle_in", counting)
        for _ in range(sweeps):
            bufs = [bytearray(4) for _ in range(files)]
            pool.read_runs([(str(tmp_path / f"f{i}"), 2, memoryview(b)) for i, b in enumerate(bufs)])
            assert [bytes(b) for b in bufs] == [bytes([i]) * 4 for i in range(files)]
            assert pool.open_count <= cap
    later = len(opened) - files  # the first sweep opens every file
    assert later <= (sweeps - 1) * max(0, files - (cap - 1)), opened


def test_the_cap_is_a_fraction_of_the_descriptor_limit(low_nofile: int) -> None:
    assert 16 <= open_cap(4) <= open_cap() <= low_nofile // 2


@pytest.mark.parametrize("runs", [8, 64])
def test_a_batch_of_many_local_runs_is_read_by_one_thread_at_a_time(tmp_path: Path, runs: int) -> None:
    """A stripe's batch (a run a rank) is read by one thread at a time: two threads' loops of tiny reads
    handed the GIL back and forth at every read. A short batch is not held back."""
    from inspector.convert import filepool

    for i in range(runs):
        (tmp_path / f"f{i}").write_bytes(bytes([i]) * 16)
    active, most = [0], [0]
    count = threading.Lock()
    both = threading.Barrier(2)
    real = FilePool.read_into

    def reading(self: FilePool, path: str, offset: int, view: memoryview) -> None:
        with count:
            active[0] += 1
            most[0] = max(most[0], active[0])
        try:
            if path.endswith("f0"):
                if runs < filepool.MANY_RUNS:
                    both.wait(timeout=2)  # both threads inside at once: nothing holds a short batch back
                threading.Event().wait(0.05)  # long enough for the other thread to be inside too
            real(self, path, offset, view)
        finally:
            with count:
                active[0] -= 1

    with FilePool(Source.at(str(tmp_path))) as pool, pytest.MonkeyPatch.context() as m:
        m.setattr(FilePool, "read_into", reading)
        bufs = [bytearray(8 * runs) for _ in range(2)]

        def batch(buf: bytearray) -> None:
            view = memoryview(buf)
            pool.read_runs([(str(tmp_path / f"f{i}"), 4, view[8 * i : 8 * i + 8]) for i in range(runs)])

        threads = [threading.Thread(target=batch, args=(b,)) for b in bufs]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert all(bytes(b) == b"".join(bytes([i]) * 8 for i in range(runs)) for b in bufs)
    assert most[0] == (1 if runs >= filepool.MANY_RUNS else 2), most


def test_shards_written_side_by_side_open_each_rank_file_through_one_pool(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stage-3 shard reads every rank's file: shards written side by side share one pool (`SharedPool`),
    so a rank file is not opened once a shard, and a process holds one big pool at a time."""
    from inspector.convert import filepool, pipeline
    from inspector.system import limits

    monkeypatch.setattr(limits, "usable_cores", lambda: 4)  # two workers: shards side by side
    spec = DemoSpec(stage=3, world_size=8, dtype="bf16", params=400_000)
    write_demo(str(tmp_path / "ckpt"), spec)
    ckpt = scan(str(tmp_path / "ckpt"))
    plan = build_plan(ckpt, ConvertOptions(dtype="bf16", workers=2, shard_size=200_000, chunk_elems=4096))
    assert len(plan.shards) >= 4 and pipeline.shards_at_once(plan) == 2
    opened: list[str] = []
    real = filepool.open_handle_in

    def counting(path: str, sources: object) -> object:
        opened.append(path)
        return real(path, sources)  # type: ignore[arg-type]

    monkeypatch.setattr(filepool, "open_handle_in", counting)
    execute(plan, str(tmp_path / "out"))
    assert_matches_expected(spec, plan, tmp_path / "out")
    per_file = {p: opened.count(p) for p in set(opened)}
    assert len(per_file) >= 8  # every rank's optimizer file (and the model states that hold buffers)
    assert max(per_file.values()) < len(plan.shards) // 2, (len(plan.shards), per_file)
