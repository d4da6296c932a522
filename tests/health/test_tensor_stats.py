"""The app's one-tensor statistics (the `s` key) stream from the tensor's bytes on the health pass's engine, with
numpy (bf16 via ml_dtypes), never torch, within the bounds numerics.py states."""

from __future__ import annotations

import math
import threading
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

from inspector.convert.reader import FilePool
from inspector.demo.writer import DemoSpec
from inspector.errors import CancelledError
from inspector.health.numerics import MEAN_SPAN, STD_REL
from inspector.health.tensor import Difference, TensorStats, difference, module_copy_segments, tensor_stats
from inspector.scan.model import Segment
from inspector.scan.scanner import scan
from tests.conftest import DemoCache


def _file(tmp_path: Path, values: np.ndarray, name: str = "t.bin") -> list[Segment]:
    """Write `values` after a 16-byte prefix, split in two segments (as two ranks would hold them)."""
    path = tmp_path / name
    raw = values.tobytes()
    path.write_bytes(b"\xff" * 16 + raw)
    half = values.size // 2
    dtype = "bfloat16" if values.dtype == ml_dtypes.bfloat16 else str(values.dtype)
    item = values.dtype.itemsize
    return [
        Segment(str(path), 16, half, dtype),
        Segment(str(path), 16 + half * item, values.size - half, dtype),
    ]


def _last(events):  # type: ignore[no-untyped-def]
    return list(events)[-1]


@pytest.mark.parametrize("dtype", [np.float32, ml_dtypes.bfloat16, np.float16])
def test_stats_match_numpy(tmp_path: Path, dtype: type) -> None:
    rng = np.random.default_rng(0)
    values = rng.normal(0.5, 2.0, 10_001).astype(dtype)
    values[5] = 0
    values[7] = np.nan
    values[9] = np.inf
    with FilePool() as pool:
        st = _last(tensor_stats(_file(tmp_path, values), pool, chunk_elems=999, bins=10))
    assert isinstance(st, TensorStats)
    ref = values.astype(np.float64)
    finite = ref[np.isfinite(ref)]
    assert st.numel == values.size and st.nans == 1 and st.infs == 1 and st.zeros == (ref == 0).sum()
    assert st.minimum == finite.min() and st.maximum == finite.max()
    assert abs(st.mean - finite.mean()) <= MEAN_SPAN * (finite.max() - finite.min())
    assert math.isclose(st.std, finite.std(), rel_tol=STD_REL)
    assert st.absmax == np.abs(finite).max()
    assert sum(st.histogram) == finite.size and len(st.histogram) == 10


def test_stats_cancel(tmp_path: Path) -> None:
    cancel = threading.Event()
    cancel.set()
    with FilePool() as pool, pytest.raises(CancelledError):
        list(tensor_stats(_file(tmp_path, np.ones(100, np.float32)), pool, cancel))


def test_difference(tmp_path: Path) -> None:
    a = np.linspace(-1, 1, 1000, dtype=np.float32)
    b = a.astype(ml_dtypes.bfloat16)
    with FilePool() as pool:
        d = _last(difference(_file(tmp_path, a, "a"), _file(tmp_path, b, "b"), pool, chunk_elems=77))
        same = _last(difference(_file(tmp_path, a, "a"), _file(tmp_path, a, "c"), pool))
    assert isinstance(d, Difference)
    assert d.max_abs == pytest.approx(np.abs(a - b.astype(np.float32)).max())
    assert same.differing == 0 and same.max_abs == 0


def test_module_copy_is_found_and_close_to_the_master(demo: DemoCache) -> None:
    ckpt = scan(str(demo(DemoSpec())))
    t = max(ckpt.tensors, key=lambda t: t.numel)
    copy = module_copy_segments(ckpt, t)
    assert copy is not None and copy[0].dtype == "bfloat16"
    with FilePool() as pool:
        d = _last(difference(t.segments, copy, pool))
    assert 0 < d.max_abs < 1e-2  # bf16 rounding of the fp32 master


def test_stats_import_no_torch() -> None:
    import subprocess
    import sys

    code = "import sys, inspector.health.tensor; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_the_app_and_the_health_pass_give_the_same_figures(demo: DemoCache) -> None:
    """One engine: the `s` key's statistics of a master are the health pass's row for it, bit for bit."""
    from inspector.health import run_check

    ckpt = scan(str(demo(DemoSpec())))
    t = max(ckpt.tensors, key=lambda t: t.numel)
    row = next(r for r in run_check(ckpt, include=[t.name]).rows if r.source == "master")
    with FilePool(ckpt.source) as pool:
        st = _last(tensor_stats(t.segments, pool))
    got = (st.numel, st.minimum, st.maximum, st.mean, st.std, st.absmax, st.zeros, st.nans, st.infs)
    s = row.stats
    assert got == (s.numel, s.minimum, s.maximum, s.mean, s.std, s.absmax, s.zeros, s.nan, s.inf)
