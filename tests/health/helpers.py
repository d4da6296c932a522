"""Independent truth for the health tests: torch statistics of values rebuilt from the demo's own value
functions (never from the scanner's segments), and a way to plant values into a checkpoint's bytes."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

from inspector.demo.spec import HALF, DemoSpec, architecture
from inspector.demo.values import expected, state_values, to_dtype
from tests.health.planting import overwrite, plant

__all__ = ["overwrite", "plant"]  # re-exported: the tests plant values through here

# Tolerances: the worst-case bounds inspector/health/numerics.py states for its float32 block sums (counts,
# min, max and abs-max exact; mean within MEAN_SPAN of max - min; std and norm relative), torch in float64.
from inspector.health.numerics import MEAN_SPAN, NORM_REL, STD_REL


def truth(spec: DemoSpec, name: str, source: str) -> np.ndarray[Any, Any]:
    """What `source` of tensor `name` holds in a demo checkpoint, from the demo's value functions."""
    params, tied = architecture(spec)
    owner = tied.get(name, name)
    p = next(q for q in params if q.name == owner)
    if source in ("master", "frozen", "buffer"):
        return np.asarray(expected(spec, owner)).reshape(-1)
    if source == "module":
        return to_dtype(expected(spec, owner).reshape(-1), HALF[spec.dtype])
    return state_values(owner, 0, p.numel, source, HALF[spec.dtype])


def torch_stats(values: np.ndarray[Any, Any]) -> dict[str, float | int]:
    """The reference: torch over float64 (bf16 widened through float32, exactly)."""
    a = values.astype(np.float32) if values.dtype.name == "bfloat16" else values
    t = torch.from_numpy(np.ascontiguousarray(a).astype(np.float64)).reshape(-1)
    fin = t[torch.isfinite(t)]
    out: dict[str, float | int] = {
        "numel": t.numel(),
        "nan": int(torch.isnan(t).sum()),
        "pos_inf": int(torch.isposinf(t).sum()),
        "neg_inf": int(torch.isneginf(t).sum()),
        "zeros": int((t == 0).sum()),
    }
    if fin.numel():
        out |= {
            "min": float(fin.min()),
            "max": float(fin.max()),
            "absmax": float(fin.abs().max()),
            "mean": float(fin.mean()),
            "std": float(fin.std(correction=0)),
            "norm": float(torch.linalg.vector_norm(fin)),
        }
    return out


def assert_matches(stats: Any, ref: dict[str, float | int], what: str) -> None:
    for k in ("numel", "nan", "pos_inf", "neg_inf", "zeros"):
        assert getattr(stats, k) == ref[k], f"{what}: {k} {getattr(stats, k)} != {ref[k]}"
    if "min" not in ref:
        assert math.isnan(stats.mean), what
        return
    assert stats.minimum == ref["min"], f"{what}: min"
    assert stats.maximum == ref["max"], f"{what}: max"
    assert stats.absmax == ref["absmax"], f"{what}: absmax"
    span = float(ref["max"]) - float(ref["min"])
    assert abs(stats.mean - ref["mean"]) <= MEAN_SPAN * span + 1e-300, f"{what}: mean"
    assert math.isclose(stats.std, ref["std"], rel_tol=STD_REL, abs_tol=1e-300), f"{what}: std"
    assert math.isclose(stats.norm, ref["norm"], rel_tol=NORM_REL, abs_tol=1e-300), f"{what}: norm"
