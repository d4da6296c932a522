"""Health and the app's per-tensor statistics read bf16 on its bits, never through ml_dtypes (#43): importing
ml_dtypes alone cost 0.66 s of a 1.98 CPU-s health run of a 200M demo. fp16 goes through numpy's float16;
only fp8 needs ml_dtypes, imported when a chunk of it is read, and its figures are still torch's.

The subprocess pattern is tests/test_import_hygiene.py's (a bf16 conversion imports no ml_dtypes)."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import ml_dtypes
import numpy as np
import pytest

from inspector.demo.writer import DemoSpec, write_demo
from inspector.format.dtypes import bits_dtype
from inspector.health import chunk_math
from inspector.health.chunk_math import Scratch
from inspector.health.numerics import EXACT_BLOCK, Accumulator, Buffers, bits, widen_into, widened
from inspector.scan.scanner import scan
from tests.health.helpers import assert_matches, plant, torch_stats

SPEC = DemoSpec(params=200_000)

# a health pass, --against the other tag, and the app's statistics of every tensor (its module copy and its
# change since the other tag: tui/screens/tensor_stats.stream_stats, what the `s` key runs)
_PASS = """
import contextlib, io, json, sys, threading
from inspector.cli.main import main
from inspector.scan.scanner import scan
from inspector.tui.screens.tensor_stats import StatsUpdate, stream_stats
root = sys.argv[1]
docs = []
for argv in (["health", root, "--json"], ["health", root, "--against", "global_step1", "--json"]):
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        rc = main(argv)
    assert rc in (0, 1), (argv, rc)  # 1: the planted values are findings
    docs.append(json.loads(out.getvalue()))
ck = scan(root)
posted = []
for t in ck.tensors:
    stream_stats(ck, t, threading.Event(), posted.append, timed=False)
results = [m.result for m in posted if isinstance(m, StatsUpdate) and m.result is not None]
lines = [r.plain for r in results if hasattr(r, "plain")]  # the difference lines (the statistics: a Group)
print(json.dumps({"docs": docs, "lines": lines, "results": len(results), "tensors": len(ck.tensors),
                  "ml_dtypes": "ml_dtypes" in sys.modules}))
"""


def _two_tags(root: Path, spec: DemoSpec) -> None:
    """global_step1 and global_step2 (`latest`) of `spec`, the second with a NaN and an Inf in its biggest
    master and, where it has one, a drifted value in its module copy: the slow paths run too."""
    write_demo(str(root), replace(spec, steps=1, tag="global_step1"))
    write_demo(str(root), replace(spec, steps=2, tag="global_step2"))
    t = max(scan(str(root)).tensors, key=lambda x: x.numel)
    plant(t.segments, [3, 5], [np.nan, np.inf])
    if t.module_copy:
        plant(t.module_copy, [7], [2.5])


@pytest.mark.parametrize(
    "spec",
    [
        replace(SPEC, stage=2),
        replace(SPEC, stage=3),
        replace(SPEC, stage=1, bf16_optimizer=True),
        replace(SPEC, stage=2, dtype="fp16"),
    ],
    ids=["bf16-z2", "bf16-z3", "bf16-optimizer", "fp16-z2"],
)
def test_health_and_tensor_statistics_import_no_ml_dtypes(tmp_path: Path, spec: DemoSpec) -> None:
    root = tmp_path / "run"
    _two_tags(root, spec)
    res = subprocess.run([sys.executable, "-c", _PASS, str(root)], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr[-3000:]
    got = json.loads(res.stdout.splitlines()[-1])
    assert got["ml_dtypes"] is False
    plain, against = got["docs"]
    half = "bfloat16" if spec.dtype == "bf16" else "float16"
    assert half in {row["dtype"] for row in plain["tensors"]}  # 16-bit values were measured
    assert any(f["code"] == "nonfinite-master" for f in plain["findings"])  # the planted NaN
    if spec.stage != 3:
        assert any(row.get("module_differing") for row in plain["tensors"])  # and the drifted copy
    assert against["against"] == "global_step1"
    assert any(row.get("delta_norm") for row in against["tensors"])
    assert got["results"] > got["tensors"]  # every tensor's statistics, and difference lines
    assert any(line.startswith("change since global_step1") for line in got["lines"]), got["lines"][:5]
    assert not any("Cannot read" in line or "cannot" in line for line in got["lines"])


FP8 = ("float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz")


def _fp8_checkpoint(root: Path) -> list[dict[str, np.ndarray]]:
    """Two DCP saves (torch's own writer: checkpoint-1, checkpoint-2) of fp8 tensors of every kind this torch
    has, with zeros, a NaN and a +Inf (NaN in the kinds without Inf) at the same places in both; returns
    each step's values as float64, as torch widens them."""
    torch = pytest.importorskip("torch")
    dcp = pytest.importorskip("torch.distributed.checkpoint")
    base = torch.randn(96, 40, generator=torch.Generator().manual_seed(0)) * 4
    steps = []
    for step in (1, 2):
        sd, values = {}, {}
        for k in (k for k in FP8 if hasattr(torch, k)):
            wide = (base + step * 0.25).reshape(-1)
            wide[:4] = 0.0
            wide[10], wide[17] = float("nan"), float("inf")
            sd[k] = wide.to(getattr(torch, k)).reshape(96, 40)
            values[k] = sd[k].to(torch.float64).reshape(-1).numpy()
        sd["float32"] = base + step
        dcp.save({"model": sd}, checkpoint_id=str(root / f"checkpoint-{step}"), no_dist=True)
        steps.append(values)
    return steps


_FP8 = """
import contextlib, io, json, sys
from inspector.cli.main import main
before = "ml_dtypes" in sys.modules
docs = []
for argv in (["health", sys.argv[1], "--json"], ["health", sys.argv[1], "--against", "checkpoint-1", "--json"]):
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(argv) in (0, 1), argv
    docs.append(json.loads(out.getvalue()))
print(json.dumps({"docs": docs, "before": before, "after": "ml_dtypes" in sys.modules}))
"""


@pytest.mark.filterwarnings("ignore::FutureWarning", "ignore::UserWarning")
def test_fp8_health_is_torchs_and_imports_ml_dtypes_then(tmp_path: Path) -> None:
    then, now = _fp8_checkpoint(tmp_path / "run")
    assert len(now) >= 2  # e4m3fn and e5m2 at least (torch >= 2.1)
    res = subprocess.run([sys.executable, "-c", _FP8, str(tmp_path / "run")], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr[-3000:]
    got = json.loads(res.stdout.splitlines()[-1])
    assert (got["before"], got["after"]) == (False, True)  # imported for the fp8 chunks, not at start
    plain, against = ({r["name"]: r for r in d["tensors"]} for d in got["docs"])
    for k, v in now.items():
        row = plain[k]
        assert row["dtype"] == k
        assert_matches(SimpleNamespace(**row, minimum=row["min"], maximum=row["max"]), torch_stats(v), k)
        # --against: a NaN or Inf left where it was is no change; the other tag's are counted
        assert against[k]["against_nonfinite"] == int((~np.isfinite(then[k])).sum()) >= 1, k
        with np.errstate(invalid="ignore"):
            moved = np.where((v == then[k]) | (np.isnan(v) & np.isnan(then[k])), 0.0, v - then[k])
        assert np.isfinite(moved).all() and moved.any()
        assert against[k]["delta_norm"] == pytest.approx(float(np.sqrt(moved @ moved)), rel=1e-12), k


def test_bf16_widened_on_the_bits_is_ml_dtypes_cast_for_every_pattern() -> None:
    """All 65,536 bf16 patterns: the shift (float32 and float64) gives ml_dtypes' own cast's bits; NaNs stay
    NaN (their sign and payload too); the health counts agree with ml_dtypes' classification."""
    pattern = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    ml = pattern.view(ml_dtypes.bfloat16)
    raw = pattern.view(bits_dtype("bfloat16"))
    with np.errstate(invalid="ignore"):  # signalling NaNs, quietened
        want32, want64 = ml.astype(np.float32), ml.astype(np.float64)
    nan = np.isnan(want32)
    assert nan.sum() == 2 * 127  # exponent all ones, mantissa non-zero, either sign
    buf = Buffers(1 << 16)
    got32 = widened(raw, buf)
    assert got32 is not None and got32.dtype == np.float32
    assert np.array_equal(got32.view(np.uint32)[~nan], want32.view(np.uint32)[~nan])
    assert np.isnan(got32[nan]).all()
    assert np.array_equal(got32.view(np.uint32)[nan], pattern[nan].astype(np.uint32) << 16)  # payload kept
    got64 = widen_into(raw, np.empty(1 << 16, np.float64))
    assert np.array_equal(got64.view(np.uint64)[~nan], want64.view(np.uint64)[~nan])
    assert np.isnan(got64[nan]).all() and np.array_equal(np.signbit(got64), np.signbit(want64))
    assert chunk_math.nonfinite(raw) == int((~np.isfinite(want32)).sum()) == 2 * 128
    acc = Accumulator()
    acc.add(raw, buf)
    st = acc.result()
    assert (st.nan, st.pos_inf, st.neg_inf, st.zeros) == (
        int(nan.sum()),
        int(np.isposinf(want32).sum()),
        int(np.isneginf(want32).sum()),
        int((want32 == 0).sum()),
    )
    finite = np.isfinite(want64)
    assert (st.minimum, st.maximum) == (float(want64[finite].min()), float(want64[finite].max()))
    # the exact paths' float64 copies (Σx², --against's Σ(x - o)²) on the bits: ml_dtypes' values, summed as
    # the health pass sums them (EXACT_BLOCK at a time)
    x, o = raw[finite], raw[finite][::-1].copy()
    xw, ow = want64[finite], want64[finite][::-1]
    s = Scratch(1 << 16)
    blocks = range(0, x.shape[0], EXACT_BLOCK)
    assert chunk_math.sum_sq(x, s) == [
        sum(float(np.einsum("i,i->", xw[i : i + EXACT_BLOCK], xw[i : i + EXACT_BLOCK])) for i in blocks)
    ]
    d = xw - ow
    assert chunk_math.delta_sq(x, o, s) == [
        sum(float(np.einsum("i,i->", d[i : i + EXACT_BLOCK], d[i : i + EXACT_BLOCK])) for i in blocks)
    ]


def test_bf16_bits_refuse_arithmetic() -> None:
    """numpy has no arithmetic on the bits' dtype: a path that forgets to widen them fails, never computes on
    the integers; ml_dtypes' arrays are read as the same bits (`bits`)."""
    raw = np.zeros(4, np.uint16).view(bits_dtype("bfloat16"))
    with pytest.raises((TypeError, ValueError)):
        np.copyto(np.empty(4), raw, casting="unsafe")
    with pytest.raises(TypeError):
        np.minimum.reduce(raw)
    b = np.array([1.5, -2.0], ml_dtypes.bfloat16)
    assert bits(b).dtype == raw.dtype and np.array_equal(bits(b).view(np.uint16), b.view(np.uint16))


def test_module_check_of_a_bf16_master_on_the_bits() -> None:
    """A bf16 master with a bf16 copy (same type: the bytes compared, no cast): a flipped last bit and a NaN
    the master lacks are found as the float64 comparison of ml_dtypes' values finds them."""
    rng = np.random.default_rng(3)
    master = rng.standard_normal(3 * EXACT_BLOCK + 5).astype(ml_dtypes.bfloat16)
    copy = master.copy()
    u = copy.view(np.uint16)
    u[7] ^= 1
    raw = master.view(bits_dtype("bfloat16")), copy.view(bits_dtype("bfloat16"))
    drift = abs(float(master[7]) - float(copy[7]))
    assert drift > 0 and chunk_math.module_diff(*raw, Scratch(1 << 18), finite=True) == (drift, 1)
    u[EXACT_BLOCK + 100] = 0x7FC1  # a NaN the master lacks: infinitely far
    assert chunk_math.module_diff(*raw, Scratch(1 << 18), finite=True) == (math.inf, 2)
    assert chunk_math.module_diff(master, copy, Scratch(1 << 18), finite=True) == (math.inf, 2)
