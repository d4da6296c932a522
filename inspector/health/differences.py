"""How two float64 blocks of the same values differ: one NaN rule for the health pass's module check and the
app's comparison of two copies of a tensor (NaN on both sides is no difference, on one side an infinite one)."""

from __future__ import annotations

import math

import numpy as np

from inspector.health.numerics import Array


def _abs_difference(a: Array, b: Array, tmp: Array) -> Array:
    """|a - b| of two float64 blocks into `tmp`: NaN on both sides is no difference, on one side an infinite
    one."""
    d = tmp[: a.shape[0]]
    with np.errstate(invalid="ignore"):  # Inf - Inf is NaN, decided below: no warning on the user's terminal
        np.subtract(a, b, out=d)
    np.abs(d, out=d)
    nan = np.isnan(d)
    if nan.any():
        both = np.isnan(a) & np.isnan(b)
        d[nan & ~both] = math.inf
        d[both] = 0.0
    return d


def max_abs_difference(a: Array, b: Array, tmp: Array) -> tuple[float, int]:
    """(largest |a - b|, elements that differ) of two float64 blocks (see `_abs_difference`)."""
    d = _abs_difference(a, b, tmp)
    differing = int(np.count_nonzero(d))
    return (float(d.max()) if differing else 0.0), differing


def compare_block(a: Array, b: Array, tmp: Array) -> tuple[float, int, float, float]:
    """(largest |a - b|, elements that differ, Σ|a - b| and Σ(a - b)² over the finite differences) of two
    float64 blocks: the app's comparison of two copies of a tensor."""
    d = _abs_difference(a, b, tmp)
    differing = int(np.count_nonzero(d))
    if not differing:
        return 0.0, 0, 0.0, 0.0
    fin = d[np.isfinite(d)]  # a copy bounded by one block
    return float(d.max()), differing, float(np.add.reduce(fin)), float(np.einsum("i,i->", fin, fin))
