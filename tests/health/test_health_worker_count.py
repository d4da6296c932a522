"""The worker count changes neither a figure nor the memory: 1, 2, 7 or 16 workers give the same report bit
for bit (their chunks differ, the groups the sums are folded in do not), NaN, Inf and a shifted tensor
included; and the CLI's peak RSS at 2, 16 and 64 workers stays in one budget."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from inspector.demo.writer import DemoSpec
from inspector.health import run_check
from inspector.health.numerics import GROUP
from inspector.health.stream import SCRATCH_BUDGET, plan_workers
from inspector.scan.scanner import scan
from inspector.system import limits
from tests.child_rss import run_cli
from tests.conftest import DemoCache
from tests.health.planting import overwrite, plant

MiB = 1 << 20
# the embedding (and its moments, its module copy) spans several GROUPs, so 1 worker (4-group chunks) and 16
# (1-group chunks) cut it differently
SPEC = DemoSpec(stage=2, world_size=2, dtype="bf16", params=12_000_000)


def _figures(report: Any) -> str:
    doc = report.as_json()
    doc.pop("seconds")
    doc.pop("threads")
    return json.dumps(doc, sort_keys=True)


@pytest.fixture(scope="module")
def planted(demo: DemoCache, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The demo with NaN and Inf in a later group of the embedding's master, and a layer-norm-like tensor
    (1 ± 1e-4: the shifted path) in place of the largest moment, so every path is taken."""
    root = demo.copy(SPEC, tmp_path_factory.mktemp("planted") / "ckpt")
    ckpt = scan(str(root))
    big = max(ckpt.tensors, key=lambda t: t.numel)
    assert big.numel > 4 * GROUP, big.numel
    plant(big.segments, [GROUP + 5, 3 * GROUP + 7, big.numel - 1], [float("nan"), float("inf"), -1e30])
    moments = dict(big.moments)
    rng = np.random.default_rng(5)
    overwrite(moments["exp_avg"], (1.0 + 1e-4 * rng.standard_normal(big.numel)).astype(np.float32))
    return root


def test_workers_give_the_same_figures(planted: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(limits, "usable_cores", lambda: 64)  # as on a 64-core node
    monkeypatch.setattr(limits, "gil_enabled", lambda: False)  # without the GIL: 16 threads run
    ckpt = scan(str(planted))
    chunks = {plan_workers(w).chunk for w in (1, 2, 7, 16)}
    assert len(chunks) > 1, chunks  # the counts do cut the streams differently
    reports = [run_check(ckpt, workers=w) for w in (1, 2, 7, 16)]
    assert [r.threads for r in reports] == [1, 2, 7, 16]
    first = _figures(reports[0])
    assert '"nan"' in first or "nan" in first.lower()
    for r in reports[1:]:
        assert _figures(r) == first


def test_memory_does_not_grow_with_the_workers(planted: Path) -> None:
    """2, 16 and 64 workers: each under 128 MiB, 64 no more than 16 (the budget holds 16 at the smallest
    chunk; the rest wait their turn), and 16 within the one scratch budget of 2."""
    peaks, outs = {}, {}
    for w in (2, 16, 64):
        peaks[w], out = run_cli(["health", str(planted), "--json", "--workers", str(w)], ok=(0, 1))  # 1: NaN
        doc = json.loads(out)
        doc.pop("seconds")
        doc.pop("threads")
        outs[w] = json.dumps(doc, sort_keys=True)
    assert outs[2] == outs[16] == outs[64]
    assert all(p <= 128 * MiB for p in peaks.values()), peaks
    # 64 asked run as the same threads as 16: equal but for allocator timing, which under a loaded machine
    # was measured at up to 11 MiB (79 / 96 / 107 MiB for 2 / 16 / 64 in one full-suite run, equal alone)
    assert peaks[64] <= peaks[16] + 16 * MiB, peaks
    assert peaks[16] <= peaks[2] + SCRATCH_BUDGET, peaks
