"""The values a demo checkpoint holds, computable for any slice without generating what comes before it.

Uniform numbers come from a counter-based hash of (parameter, element index) (splitmix64's finaliser), so
a 1B-parameter demo is written in flat memory and `expected()` can say what any tensor holds. numpy only:
the demo needs no torch.
"""

from __future__ import annotations

import bisect
import zlib
from typing import Any

import numpy as np

from inspector.convert.cast import cast_into
from inspector.demo.spec import HALF, DemoSpec, Param, architecture
from inspector.format.dtypes import numpy_dtype

Array = np.ndarray[Any, Any]


def _uniform(seed: int, start: int, count: int) -> Array:
    """Uniform [0, 1) float32 for elements [start, start+count) of stream `seed`."""
    if count <= 0:
        return np.empty(0, np.float32)
    x = np.arange(start, start + count, dtype=np.uint64)
    x += np.uint64((seed * 0x9E3779B97F4A7C15) & 0xFFFFFFFFFFFFFFFF)
    x ^= x >> np.uint64(30)
    x *= np.uint64(0xBF58476D1CE4E5B9)
    x ^= x >> np.uint64(27)
    x *= np.uint64(0x94D049BB133111EB)
    x ^= x >> np.uint64(31)
    return ((x >> np.uint64(40)).astype(np.float32)) * np.float32(1.0 / (1 << 24))


def _seed(name: str) -> int:
    return zlib.crc32(name.encode()) & 0x7FFFFFFF


def master_values(name: str, start: int, count: int) -> Array:
    """fp32 master weights of elements [start, start+count) of a parameter, flattened."""
    u = _uniform(_seed(name), start, count)
    u -= np.float32(0.5)
    if name.endswith("norm.weight"):
        u *= np.float32(0.1)
        u += np.float32(1.0)
        return u
    u *= np.float32(0.08)
    return u


def to_dtype(a: Array, dtype: str) -> Array:
    """`a` in `dtype`, rounded as torch's `.to()` rounds (cast.py)."""
    out = np.empty(a.shape, numpy_dtype(dtype))
    cast_into(a.reshape(-1), out.reshape(-1), threads=1)
    return out


def state_values(name: str, start: int, count: int, state: str, half: str) -> Array:
    """The value of a state ("master", "exp_avg", "exp_avg_sq", "half", "frozen") for a slice."""
    m = master_values(name, start, count)
    if state == "master":
        return m
    if state == "exp_avg":
        return m * np.float32(0.1)
    if state == "exp_avg_sq":
        return m * m * np.float32(0.01)
    return to_dtype(m, half)  # "half" / "frozen": the 16-bit copy


def buffer_values(p: Param) -> Array:
    if p.dtype == "int64":
        return np.full(p.shape, 12_345, dtype=np.int64)
    n = p.numel
    inv = 1.0 / (10_000 ** (np.arange(n, dtype=np.float64) / max(n, 1)))
    return inv.astype(np.float32).reshape(p.shape)


def expected(spec: DemoSpec, name: str) -> Array:
    """What `get_fp32_state_dict_from_zero_checkpoint` should return for `name` (frozen stay 16-bit)."""
    params, tied = architecture(spec)
    name = tied.get(name, name)
    p = next(q for q in params if q.name == name)
    if p.kind == "buffer":
        return buffer_values(p)
    if p.kind == "frozen":
        return state_values(name, 0, p.numel, "frozen", HALF[spec.dtype]).reshape(p.shape)
    return master_values(name, 0, p.numel).reshape(p.shape)


class FlatGroup:
    """Producer of any slice of a group's flat buffer (params back to back, zeros in padding)."""

    def __init__(self, entries: list[tuple[str, int, int, int]], state: str, half: str) -> None:
        # entries: (name, flat offset, param start element, count) sorted by flat offset
        self.entries = entries
        self.starts = [e[1] for e in entries]
        self.state = state
        self.half = half

    def __call__(self, start: int, count: int) -> Array:
        dtype = self.half if self.state in ("half", "frozen") else "float32"
        out = np.zeros(count, dtype=numpy_dtype(dtype))
        i = max(0, bisect.bisect_right(self.starts, start) - 1)
        end = start + count
        while i < len(self.entries):
            name, foff, pstart, n = self.entries[i]
            if foff >= end:
                break
            lo, hi = max(start, foff), min(end, foff + n)
            if lo < hi:
                out[lo - start : hi - start] = state_values(
                    name, pstart + lo - foff, hi - lo, self.state, self.half
                )
            i += 1
        return out
