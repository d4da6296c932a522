"""Health's stripes (`health/units.py`): runs of small stage-3 jobs read as one window of every rank's flat
tensor give the figures, bit for bit, that reading each job's slices rank by rank gives (any chunk, any
worker count, with `--against`), read each rank once a stripe, and refuse a rank file cut short by name."""

from __future__ import annotations

import importlib
import shutil
from pathlib import Path
from typing import Any

import pytest

from inspector.convert.stripes import Stripe, stripe_reads
from inspector.health.check import run_check
from inspector.health.jobs import Job, plan_jobs
from inspector.health.numerics import GROUP
from inspector.health.stream import plan_units, unit_reads
from inspector.health.units import ROW_BYTES, jobs_of
from inspector.scan.scanner import scan
from inspector.scan.slices import RankSlices
from tests.convert.test_stripes import DEEP, assert_cut_short_refused


def _rows(report: Any) -> list[tuple[Any, ...]]:
    return [
        (r.name, r.source, r.stats, r.delta_norm, r.against_norm, r.against_nonfinite) for r in report.rows
    ]


def _one_by_one(monkeypatch: pytest.MonkeyPatch) -> None:
    """The pass with every job read on its own, rank by rank (the path before stripes)."""
    check_module = importlib.import_module("inspector.health.check")  # the package names a function `check`
    monkeypatch.setattr(check_module, "plan_units", lambda jobs, chunk: list(jobs))


@pytest.mark.parametrize(("chunk", "workers"), [(GROUP, 1), (GROUP, 2), (4 * GROUP, 2)])
def test_stripes_give_the_figures_job_by_job_reads_give(
    demo: Any, monkeypatch: pytest.MonkeyPatch, chunk: int, workers: int
) -> None:
    ckpt = scan(str(demo(DEEP)))
    units = plan_units(plan_jobs(ckpt, ckpt.tensors, None), chunk)
    assert any(isinstance(u, Stripe) and len(u.tensors) > 1 for u in units)  # the runs are there
    striped = run_check(ckpt, workers=workers, chunk_elems=chunk)
    with monkeypatch.context() as m:
        _one_by_one(m)
        alone = run_check(ckpt, workers=workers, chunk_elems=chunk)
    assert _rows(striped) == _rows(alone)
    assert striped.findings == alone.findings


def test_against_another_tag_in_stripes_gives_the_same_figures(
    demo: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`--against` reads the other tag's windows beside this one's (their own rank tables) into the next
    buffer: the change's norms and the moments' then are those job by job."""
    root = Path(demo(DEEP))
    other = tmp_path / "other"
    shutil.copytree(root, other)
    ckpt, then = scan(str(root)), scan(str(other))
    units = plan_units(plan_jobs(ckpt, ckpt.tensors, then), GROUP)
    st = next(u for u in units if isinstance(u, Stripe) and any(j.against for j in u.tensors))
    assert len({id(w.starts) for w in st.windows}) == len(st.windows) >= 2
    striped = run_check(ckpt, then, workers=2)
    with monkeypatch.context() as m:
        _one_by_one(m)
        alone = run_check(ckpt, then, workers=2)
    assert _rows(striped) == _rows(alone)
    assert any(r.delta_norm == 0.0 for r in striped.rows)  # a copy: no change, measured


def test_each_rank_is_read_once_a_window_within_the_raw_buffer(demo: Any) -> None:
    ckpt = scan(str(demo(DEEP)))
    jobs = plan_jobs(ckpt, ckpt.tensors, None)
    units = plan_units(jobs, GROUP)
    assert [j for u in units for j in jobs_of(u)] == jobs  # every job once, in order
    for u in units:
        if not isinstance(u, Stripe):
            continue
        reads = stripe_reads(u)
        assert len({(f, off) for f, off, _, _ in reads}) == len(reads) == sum(len(w.ends) for w in u.windows)
        size = u.windows[0].starts.itemsize
        assert all(at + n <= u.rows * size <= GROUP * ROW_BYTES for _, _, at, n in reads)
    by_file, count = unit_reads(units)
    alone, alone_count = unit_reads([*jobs])
    assert count < alone_count / 3  # the runs' reads, not one a rank and job
    assert set(by_file) == set(alone) and all(by_file[f] >= alone[f] for f in alone)


def test_a_rank_file_cut_short_after_the_scan_is_refused_by_name(demo: Any) -> None:
    ckpt = scan(str(demo(DEEP)))
    units = plan_units(plan_jobs(ckpt, ckpt.tensors, None), GROUP)
    st = next(u for u in units if isinstance(u, Stripe))
    job: Job = st.tensors[0]
    slices = job.segments
    assert isinstance(slices, RankSlices)
    assert_cut_short_refused(slices, lambda: run_check(ckpt, workers=2))


def test_from_a_cold_cache_every_window_of_a_stripe_is_asked_ahead(
    demo: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from inspector.convert import reader

    ckpt = scan(str(demo(DEEP)))
    warm = run_check(ckpt, workers=2, chunk_elems=GROUP)
    asked: list[tuple[str, int, int]] = []
    monkeypatch.setattr(reader.FilePool, "mostly_cold", lambda self, by_file: True)
    monkeypatch.setattr(reader.FilePool, "advise", lambda self, p, o, n: asked.append((p, o, n)))
    cold = run_check(ckpt, workers=2, chunk_elems=GROUP)
    assert _rows(cold) == _rows(warm)
    units = plan_units(plan_jobs(ckpt, ckpt.tensors, None), GROUP)
    windows = {(f, o, n) for u in units if isinstance(u, Stripe) for f, o, _, n in stripe_reads(u)}
    assert windows and windows <= set(asked)
