"""health's time before it runs: the one calibrated model (`convert.calibrate`) fed with what the pass reads
(every stream, the module copy and `--against` in step) and does with it (reduced once), on the threads the
pass itself would run."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from inspector.convert import calibrate as cal_mod
from inspector.convert.calibrate import Work
from inspector.convert.options import ConvertOptions, select
from inspector.demo.writer import DemoSpec, write_demo
from inspector.health.estimate import health_seconds
from inspector.health.jobs import plan_jobs
from inspector.health.stream import max_threads
from inspector.scan.scanner import scan
from inspector.system import limits


def test_health_hands_the_model_what_the_pass_reads(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    write_demo(str(tmp_path / "ck"), DemoSpec(params=300_000))
    ckpt = scan(str(tmp_path / "ck"))
    seen: list[tuple[Mapping[str, int], Work, int]] = []
    real = cal_mod.calibrated_seconds

    def spy(sources: Any, reads: Mapping[str, int], work: Work, workers: int, *a: Any) -> float:
        seen.append((reads, work, workers))
        return real(sources, reads, work, workers, *a)

    monkeypatch.setattr(cal_mod, "calibrated_seconds", spy)
    monkeypatch.setattr(limits, "usable_cores", lambda: 64)  # as on a node of many cores
    monkeypatch.setattr(limits, "gil_enabled", lambda: False)  # without the GIL: every worker asked runs
    tensors = select(ckpt, ConvertOptions())
    jobs = plan_jobs(ckpt, tensors, None)
    total = sum(j.nbytes for j in jobs)
    assert health_seconds(ckpt, tensors, None, 3) > 0
    reads, work, workers = seen[-1]
    assert sum(reads.values()) == work.read == work.reduced == total
    assert workers == 3 and work.pieces == len(jobs) and not work.written
    health_seconds(ckpt, tensors, None, 10_000)  # more than the budget holds: as many as the pass runs
    assert seen[-1][2] == max_threads()
    monkeypatch.setattr(limits, "gil_enabled", lambda: True)  # with it, the ceiling's
    health_seconds(ckpt, tensors, None, 16)
    assert seen[-1][2] == limits.LOCAL_THREADS
