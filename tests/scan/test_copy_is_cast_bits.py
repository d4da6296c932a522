"""ZeRO-0's proof that a module copy is its master rounded (`parallel_checks.copy_is_not_cast`) rounds fp32 to
bf16 on the bits: the same answer as ml_dtypes' cast for every value, and a ZeRO-0 bf16 scan never imports
ml_dtypes (~0.7 CPU-s, more than the scan)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np

from inspector.scan.parallel_checks import _round_bf16

LAYOUTS = Path(__file__).resolve().parents[1] / "fixtures" / "layouts"


def test_rounding_on_the_bits_is_ml_dtypes_cast() -> None:
    """Every bf16 pattern with the low halves that decide rounding (ties to even, just below and above
    them, zero, all ones), both signs; NaNs excluded (the check compares NaN-ness for those)."""
    import ml_dtypes

    high = np.arange(1 << 16, dtype=np.uint32) << 16
    lows = np.array([0, 1, 0x7FFF, 0x8000, 0x8001, 0xFFFF, 0x4000, 0xC000], np.uint32)
    u = (high[:, None] | lows[None, :]).ravel()
    m = u.view(np.float32)
    m = m[~np.isnan(m)]
    want = m.astype(ml_dtypes.bfloat16).view(np.uint16)
    assert np.array_equal(_round_bf16(m), want)


_SCAN = """
import json, sys
from inspector.scan.scanner import scan
ck = scan(sys.argv[1])
print(json.dumps({"tensors": len(ck.tensors), "errors": len(ck.errors), "ml_dtypes": "ml_dtypes" in sys.modules}))
"""


def test_a_zero0_bf16_scan_imports_no_ml_dtypes() -> None:
    for name in ("dp_z0_bf16", "tp_z0_bf16", "moe_z0_bf16"):
        res = subprocess.run([sys.executable, "-c", _SCAN, str(LAYOUTS / name / "ckpt")], capture_output=True, text=True)
        assert res.returncode == 0, res.stderr[-2000:]
        got = json.loads(res.stdout.splitlines()[-1])
        assert got["tensors"] and not got["errors"] and got["ml_dtypes"] is False, (name, got)
