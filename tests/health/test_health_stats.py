"""Every statistic of every source equals torch's on values rebuilt independently (tolerances in helpers)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from inspector.demo.writer import DemoSpec
from inspector.health import run_check
from inspector.health.numerics import Accumulator, Buffers
from inspector.scan.model import Kind
from inspector.scan.scanner import scan
from tests.conftest import DemoCache
from tests.health.helpers import MEAN_SPAN, NORM_REL, STD_REL, assert_matches, plant, torch_stats, truth

SPECS = [
    DemoSpec(stage=1, world_size=2, dtype="bf16", params=300_000),
    DemoSpec(stage=2, world_size=3, dtype="fp16", params=300_000),
    DemoSpec(stage=3, world_size=2, dtype="bf16", params=300_000),
    DemoSpec(stage=2, world_size=1, dtype="fp32", params=300_000, tied=False),
]


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: f"s{s.stage}-ws{s.world_size}-{s.dtype}")
def test_every_source_matches_torch(demo: DemoCache, spec: DemoSpec) -> None:
    ckpt = scan(str(demo(spec)))
    # small chunks that cut rows and rank boundaries anywhere: the sums must not depend on the cut
    report = run_check(ckpt, chunk_elems=4099, threads=3)
    sources = {(r.name, r.source) for r in report.rows}
    for t in ckpt.tensors:
        if t.kind is Kind.TIED:
            assert (t.name, "master") not in sources  # read once, under its owner
            continue
        want = {"trainable": ["master", "exp_avg", "exp_avg_sq"], "frozen": ["frozen"], "buffer": ["buffer"]}
        expect = want[str(t.kind)] + (["module"] if t.kind is Kind.TRAINABLE and spec.stage != 3 else [])
        assert {s for n, s in sources if n == t.name} == set(expect), t.name
    for r in report.rows:
        assert_matches(r.stats, torch_stats(truth(spec, r.name, r.source)), f"{r.name}/{r.source}")
        if r.source == "module":
            assert (r.module_max_diff, r.module_differing) == (0.0, 0), r.name
        if r.source == "exp_avg_sq" and len(r.shape) >= 2:
            assert r.stats.zero_rows == 0
    assert not report.findings, [f.message for f in report.findings]


def test_chunking_does_not_change_the_numbers(demo: DemoCache) -> None:
    ckpt = scan(str(demo(SPECS[0])))
    a = run_check(ckpt, chunk_elems=1 << 18, threads=1)
    b = run_check(ckpt, chunk_elems=777, threads=2)
    for x, y in zip(a.rows, b.rows, strict=True):
        assert (x.name, x.source) == (y.name, y.source)
        for k in ("numel", "nan", "pos_inf", "neg_inf", "zeros", "minimum", "maximum", "zero_rows"):
            assert getattr(x.stats, k) == getattr(y.stats, k), (x.name, k)
        # the float32 blocks fall elsewhere: each side within its bound of the truth, so twice that apart
        span = x.stats.maximum - x.stats.minimum
        assert abs(x.stats.mean - y.stats.mean) <= 2 * MEAN_SPAN * span + 1e-300, x.name
        assert x.stats.std == pytest.approx(y.stats.std, rel=2 * STD_REL, abs=1e-300), x.name
        assert x.stats.norm == pytest.approx(y.stats.norm, rel=2 * NORM_REL, abs=1e-300), x.name


def test_nonfinite_values_are_counted_and_excluded(demo: DemoCache, tmp_path: Path) -> None:
    """NaN, +Inf, -Inf and zeros planted in a master: counts exact, min/max/mean/std/norm over the rest."""
    spec = SPECS[1]
    root = demo.copy(spec, tmp_path / "ck")
    name = "model.layers.0.mlp.up_proj.weight"
    idx, vals = [0, 5, 9000, 17, 18], [float("nan"), float("inf"), float("-inf"), 0.0, float("nan")]
    plant(scan(str(root)).tensor(name).segments, idx, vals)
    ref = truth(spec, name, "master").copy()
    ref[idx] = vals
    row = next(
        r for r in run_check(scan(str(root)), chunk_elems=4096).rows if (r.name, r.source) == (name, "master")
    )
    assert (row.stats.nan, row.stats.pos_inf, row.stats.neg_inf) == (2, 1, 1)
    assert_matches(row.stats, torch_stats(ref), name)


def test_all_nonfinite_and_empty_streams() -> None:
    acc = Accumulator()
    acc.add(np.array([np.nan, np.inf, -np.inf], np.float32), Buffers(8))
    st = acc.result()
    assert (st.nan, st.pos_inf, st.neg_inf, st.finite) == (1, 1, 1, 0)
    assert np.isnan(st.mean) and np.isnan(st.minimum) and st.norm == 0.0
    empty = Accumulator().result()
    assert empty.numel == 0 and np.isnan(empty.std)


def test_zero_rows_across_chunk_cuts() -> None:
    """Rows of zeros counted whatever the chunk cuts, NaN never counted as zero."""
    rng = np.random.default_rng(0)
    x = rng.random((40, 7)).astype(np.float32) + 0.5
    x[[0, 3, 4, 39]] = 0
    x[10, 2] = np.nan
    x[11] = 0
    x[11, 6] = np.nan
    for chunk in (3, 7, 8, 13, 280, 1000):
        acc = Accumulator(row=7)
        flat = x.reshape(-1)
        buf = Buffers(chunk)
        for i in range(0, flat.size, chunk):
            acc.add(flat[i : i + chunk], buf)
        assert acc.result().zero_rows == 4, chunk
