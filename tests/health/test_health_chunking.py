"""The chunk one health worker reduces in, chosen by timing the machine's caches (`health.chunking`): the smaller
size only where it is clearly faster, never for several workers or a pass too small to pay for the probe,
the figures the same bits whichever size is chosen, and health's preflight pricing the pass in the chunk it
will run in."""

from __future__ import annotations

import importlib
from typing import Any

import pytest

from inspector.health import chunking
from inspector.health.chunking import MARGIN, SMALL, Choice, chunk_choice
from inspector.health.stream import CHUNK_ELEMS, Streamer, plan_units, unit_reads

# the package exports its function as `check`: the module itself, to patch what it calls
check_module = importlib.import_module("inspector.health.check")


@pytest.fixture(autouse=True)
def _fresh_answer() -> Any:
    chunk_choice.cache_clear()
    yield
    chunk_choice.cache_clear()


@pytest.mark.parametrize(
    ("small", "large", "chosen", "speedup"),
    [
        (0.45, 1.0, SMALL, 1 / 0.45),  # the Xeon VM's one thread: about twice as fast
        (MARGIN, 1.0, SMALL, 1 / MARGIN),
        (MARGIN + 0.01, 1.0, CHUNK_ELEMS, 1.0),  # not clearly faster: the plan's
        (1.3, 1.0, CHUNK_ELEMS, 1.0),  # the AMD VM's: slower
    ],
)
def test_the_smaller_chunk_only_where_clearly_faster(
    monkeypatch: pytest.MonkeyPatch, small: float, large: float, chosen: int, speedup: float
) -> None:
    timed: list[int] = []

    def seconds(chunk: int) -> float:
        timed.append(chunk)
        return small if chunk == SMALL else large

    monkeypatch.setattr(chunking, "_seconds", seconds)
    assert chunk_choice(1, CHUNK_ELEMS) == (chosen, pytest.approx(speedup))
    assert sorted(timed) == [SMALL, CHUNK_ELEMS]


@pytest.mark.parametrize(("threads", "chunk"), [(2, CHUNK_ELEMS), (16, CHUNK_ELEMS), (1, SMALL)])
def test_no_probe_for_several_workers_or_a_chunk_already_small(
    monkeypatch: pytest.MonkeyPatch, threads: int, chunk: int
) -> None:
    monkeypatch.setattr(chunking, "_seconds", lambda c: pytest.fail("probed"))
    assert chunk_choice(threads, chunk) == (chunk, 1.0)


def test_the_probe_times_both_sizes_for_real() -> None:
    """Without a stand-in: both sizes are timed (a positive time each) and the answer is one of them, at a
    speed-up of at least 1/MARGIN where it is the smaller."""
    assert chunking._seconds(SMALL) > 0 and chunking._seconds(CHUNK_ELEMS) > 0
    chunk, speedup = chunk_choice(1, CHUNK_ELEMS)
    assert (chunk, speedup) == (CHUNK_ELEMS, 1.0) or (chunk == SMALL and speedup >= 1 / MARGIN)


def _chunks_used(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    used: list[int] = []
    init = Streamer.__init__

    def recording(self: Streamer, *a: Any, **kw: Any) -> None:
        init(self, *a, **kw)
        used.append(self.chunk)

    monkeypatch.setattr(Streamer, "__init__", recording)
    return used


def test_a_big_one_worker_pass_runs_the_chosen_chunk_with_the_same_figures(
    demo: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A pass past WORTH on one worker asks the probe (here made to choose SMALL over a plan of 4 x SMALL)
    and runs its chunk; the report is the same bits as the plan's chunk gives."""
    from inspector.demo.writer import DemoSpec
    from inspector.health import run_check
    from inspector.scan.scanner import scan

    ckpt = scan(str(demo(DemoSpec(stage=2, world_size=2, params=6_000_000))))  # 536K-element tensors
    plain = run_check(ckpt, workers=1).as_json()
    used = _chunks_used(monkeypatch)
    asked: list[tuple[int, int]] = []

    def chosen(threads: int, chunk: int) -> Choice:
        asked.append((threads, chunk))
        return Choice(SMALL, 2.0)

    monkeypatch.setattr(chunking, "WORTH", 0)
    monkeypatch.setattr(chunking, "chunk_choice", chosen)
    timed = run_check(ckpt, workers=1).as_json()
    assert asked == [(1, CHUNK_ELEMS)] and used == [SMALL]
    for d in (plain, timed):
        d.pop("seconds"), d.pop("threads")
    assert timed == plain


def test_no_probe_below_worth_or_with_a_chunk_asked(demo: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from inspector.demo.writer import DemoSpec
    from inspector.health import run_check
    from inspector.scan.scanner import scan

    ckpt = scan(str(demo(DemoSpec(stage=2, world_size=2, params=400_000))))
    monkeypatch.setattr(chunking, "chunk_choice", lambda *a: pytest.fail("probed"))
    used = _chunks_used(monkeypatch)
    run_check(ckpt, workers=1)  # a few MB: far below WORTH
    monkeypatch.setattr(chunking, "WORTH", 0)
    run_check(ckpt, workers=1, chunk_elems=SMALL * 2)  # the caller's chunk stands
    assert used == [CHUNK_ELEMS, SMALL * 2]


@pytest.mark.parametrize("speedup", [1.0, 2.5])
def test_preflight_prices_the_pass_in_the_chunk_it_will_run(
    demo: Any, monkeypatch: pytest.MonkeyPatch, speedup: float
) -> None:
    """health's estimate asks the pass's own question: where the smaller chunk is chosen, its numpy work
    (statistics and the module copies' check) is priced at the chosen size's speed, and its reads are cut
    in that chunk; otherwise the plan's chunk at the probe's speed."""
    import inspector.convert.calibrate as calibration
    from inspector.convert.options import ConvertOptions, select
    from inspector.demo.writer import DemoSpec
    from inspector.health.estimate import health_seconds
    from inspector.health.jobs import plan_jobs
    from inspector.scan.scanner import scan
    from inspector.scan.slices import segments_nbytes

    ckpt = scan(str(demo(DemoSpec(stage=2, world_size=2, params=6_000_000))))
    tensors = select(ckpt, ConvertOptions())
    jobs = plan_jobs(ckpt, tensors, None)
    chunk = SMALL if speedup > 1 else CHUNK_ELEMS
    asked: list[tuple[int, int, int]] = []
    monkeypatch.setattr(chunking, "WORTH", 0)
    monkeypatch.setattr(chunking, "chunk_choice", lambda t, c: asked.append((t, c)) or Choice(chunk, speedup))
    works: list[Any] = []
    monkeypatch.setattr(calibration, "estimate_seconds", lambda cal, n, work: works.append(work) or 1.0)
    health_seconds(ckpt, tensors, None, workers=1)
    (work,) = works
    assert asked == [(1, CHUNK_ELEMS)]
    assert work.reduced == round(sum(j.nbytes for j in jobs) / speedup)
    assert work.checked == round(sum(segments_nbytes(j.module) for j in jobs) / speedup) > 0
    assert work.ranges == unit_reads(plan_units(jobs, chunk))[1]
