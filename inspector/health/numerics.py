"""Streaming reductions over float64 chunks held in fixed, reused buffers: memory is one chunk per stream.

The same statistics as `convert/stats.py` (the app's `s` key: NaN/Inf counted apart, min/max/mean/std over
the finite values, float64 sums), reorganised for a whole-checkpoint pass:
no allocation per chunk, and a fast path that proves a chunk finite from one dot product (the sum of squares
of values that fit float32 cannot overflow float64, so it is finite exactly when every value is), so the
masking work runs only on chunks that hold a NaN or an Inf. numpy releases the GIL in every call used here,
so several streams run on several cores.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

Array = np.ndarray[Any, Any]


@dataclass(frozen=True, slots=True)
class Stats:
    """One source of one tensor. min/max/mean/std/absmax are over the finite values; NaN if none are."""

    numel: int
    nan: int
    pos_inf: int
    neg_inf: int
    zeros: int
    minimum: float
    maximum: float
    absmax: float
    mean: float
    std: float  # population standard deviation (torch's `std(unbiased=False)`)
    norm: float  # L2 norm of the finite values
    zero_rows: int | None = None  # rows (first axis) that are zero throughout; exp_avg_sq of 2-D+ tensors

    @property
    def inf(self) -> int:
        return self.pos_inf + self.neg_inf

    @property
    def finite(self) -> int:
        return self.numel - self.nan - self.inf

    @property
    def all_zero(self) -> bool:
        return self.numel > 0 and self.zeros == self.numel

    @property
    def constant(self) -> bool:
        """Every value equal (and finite), more than one of them."""
        return self.numel > 1 and self.finite == self.numel and self.minimum == self.maximum


class Accumulator:
    """Sums of one stream, fed its chunks in their stored dtype; `f`, `mask` and `bits` are scratch.

    Values are shifted by the first chunk's mean while they are widened to float64 (one pass), so the
    variance is a sum of small squares instead of a difference of large ones; the norm is recovered exactly
    from the shifted sums. Min and max are the stored numbers themselves: numpy's own min/max where it has the type,
    else read back at the arg-min/arg-max of the shifted values (the shift is monotonic)."""

    __slots__ = ("_rows", "hi", "k", "lo", "n", "nan", "neg_inf", "numel", "pos_inf", "s1", "s2", "zeros")

    def __init__(self, row: int = 0) -> None:
        self.numel = self.n = self.nan = self.pos_inf = self.neg_inf = self.zeros = 0
        self.lo, self.hi = math.inf, -math.inf
        self.k: float | None = 0.0 if row else None  # zero rows are read from unshifted values
        self.s1 = self.s2 = 0.0
        self._rows = ZeroRows(row) if row else None

    def add(self, x: Array, f: Array, mask: Array, bits: Array) -> None:
        """Fold in one chunk `x` (any numeric dtype). `f` float64, `mask` bool and `bits` uint16 scratch of
        at least len(x); on return `f[:len(x)]` holds the chunk in float64 minus `self.k`."""
        size = x.shape[0]
        if not size:
            return
        self.numel += size
        self.zeros += count_zeros(x, mask, bits)
        f = f[:size]
        if self.k is None:
            np.copyto(f, x, casting="unsafe")
            first = float(f.sum()) / size
            self.k = first if math.isfinite(first) else 0.0
            f -= self.k
        else:
            np.subtract(x, self.k, out=f, dtype=np.float64)
        if self._rows is not None:
            self._rows.add(f, mask[:size])
        s2 = float(np.einsum("i,i->", f, f))
        if math.isfinite(s2):  # the fast path: no NaN or Inf in this chunk (see the module docstring)
            g, xs = f, x
        else:
            m = mask[:size]
            np.isnan(f, out=m)
            self.nan += int(np.count_nonzero(m))
            np.isposinf(f, out=m)
            self.pos_inf += int(np.count_nonzero(m))
            np.isneginf(f, out=m)
            self.neg_inf += int(np.count_nonzero(m))
            np.isfinite(f, out=m)
            g, xs = f[m], x[m]  # copies bounded by one chunk; only chunks holding NaN/Inf pay for them
            if not g.shape[0]:
                return
            s2 = float(np.einsum("i,i->", g, g))
        self.s2 += s2
        self.s1 += float(g.sum())
        self.n += g.shape[0]
        if xs.dtype.kind in "fiu":  # numpy's own types: their min/max loops are the fastest pass
            lo, hi = float(xs.min()), float(xs.max())
        else:  # bfloat16 and fp8: read back at the shifted values' arg-min/arg-max
            lo, hi = float(xs[int(g.argmin())]), float(xs[int(g.argmax())])
        self.lo, self.hi = min(self.lo, lo), max(self.hi, hi)

    def result(self) -> Stats:
        n, k = self.n, self.k or 0.0
        mean_shift = self.s1 / n if n else 0.0
        sq = self.s2 + 2.0 * k * self.s1 + n * k * k  # sum of x^2 from the shifted sums
        return Stats(
            numel=self.numel,
            nan=self.nan,
            pos_inf=self.pos_inf,
            neg_inf=self.neg_inf,
            zeros=self.zeros,
            minimum=self.lo if n else math.nan,
            maximum=self.hi if n else math.nan,
            absmax=max(abs(self.lo), abs(self.hi)) if n else math.nan,
            mean=k + mean_shift if n else math.nan,
            std=math.sqrt(max(self.s2 / n - mean_shift * mean_shift, 0.0)) if n else math.nan,
            norm=math.sqrt(max(sq, 0.0)),
            zero_rows=self._rows.count if self._rows is not None else None,
        )


def count_zeros(x: Array, mask: Array, bits: Array) -> int:
    """Elements equal to zero (either sign), compared in the stored dtype: bfloat16 through its bits (the
    ml_dtypes comparison is slower), everything else with numpy's own."""
    size = x.shape[0]
    if x.dtype.name == "bfloat16":
        b = bits[:size]
        np.bitwise_and(x.view(np.uint16), 0x7FFF, out=b)
        return size - int(np.count_nonzero(b))
    m = mask[:size]
    np.equal(x, 0, out=m)
    return int(np.count_nonzero(m))


class ZeroRows:
    """Counts rows of `row` elements that are zero throughout, over chunks that may cut rows anywhere."""

    __slots__ = ("count", "open_zero", "pos", "row")

    def __init__(self, row: int) -> None:
        self.row = row
        self.pos = 0  # elements seen
        self.open_zero = True  # the row in progress has been zero so far
        self.count = 0

    def add(self, x: Array, mask: Array) -> None:
        np.not_equal(x, 0.0, out=mask)  # NaN counts as non-zero
        n, i, row = x.shape[0], 0, self.row
        off = self.pos % row
        if off:  # finish the row the previous chunk left open
            take = min(row - off, n)
            self.open_zero &= not bool(mask[:take].any())
            i = take
            if off + take == row:
                self.count += self.open_zero
                self.open_zero = True
        full = (n - i) // row
        if full:
            per_row = np.count_nonzero(mask[i : i + full * row].reshape(full, row), axis=1)
            self.count += int(np.count_nonzero(per_row == 0))
            i += full * row
        if i < n:  # a row this chunk starts and the next one finishes
            self.open_zero = not bool(mask[i:n].any())
        self.pos += n


def max_abs_difference(a: Array, b: Array, tmp: Array) -> tuple[float, int]:
    """(largest |a - b|, elements that differ) of two float64 chunks; NaN on both sides is no difference,
    NaN on one side is an infinite one."""
    size = a.shape[0]
    d = tmp[:size]
    np.subtract(a, b, out=d)
    np.abs(d, out=d)
    nan = np.isnan(d)
    if nan.any():
        both = np.isnan(a) & np.isnan(b)
        d[nan & ~both] = math.inf
        d[both] = 0.0
    differing = int(np.count_nonzero(d))
    return (float(d.max()) if differing else 0.0), differing
