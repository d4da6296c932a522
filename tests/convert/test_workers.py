"""The worker count changes no output byte and no memory: a conversion at 2, 16 and 64 workers writes the
same files, each run's peak RSS under 128 MiB and 64 workers no larger than 2 (one buffer budget, divided)."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from inspector.convert.options import ConvertOptions
from inspector.convert.pipeline import pool_plan
from inspector.convert.plan import build_plan
from inspector.demo.writer import DemoSpec
from inspector.scan.scanner import scan
from tests.child_rss import run_cli
from tests.conftest import DemoCache

MiB = 1 << 20
SPEC = DemoSpec(stage=2, world_size=2, dtype="bf16", params=12_000_000)


def _digests(out: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(out.iterdir())}


@pytest.mark.parametrize("dtype", ["bf16", "fp32"])
def test_workers_change_no_byte_and_no_memory(demo: DemoCache, tmp_path: Path, dtype: str) -> None:
    root = demo(SPEC)
    peaks, files = {}, {}
    for w in (2, 16, 64):
        out = tmp_path / f"out{w}"
        args = ["convert", str(root), str(out), "--format", "weights", "--dtype", dtype, "--workers", str(w)]
        peaks[w], _ = run_cli(args)
        files[w] = _digests(out)
    assert files[2] == files[16] == files[64]
    assert all(p <= 128 * MiB for p in peaks.values()), peaks
    assert peaks[64] <= peaks[2] + 8 * MiB, peaks


def test_more_workers_get_smaller_buffers_in_the_same_budget(demo: DemoCache) -> None:
    plan = build_plan(scan(str(demo(SPEC))), ConvertOptions(dtype="bf16"))
    budget = plan.buffer_bytes
    for workers in (1, 2, 3, 8, 16, 64, 96, 1024):
        depth, limit = pool_plan(plan, workers)
        src = max(s.buffer_size(limit) for s in plan.shards)
        out = max(s.out_buffer_size(limit) for s in plan.shards)
        assert depth * (src + out) <= budget, workers
        assert depth >= plan.depth
