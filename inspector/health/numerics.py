"""Streaming reductions over one chunk at a time in fixed, reused buffers: memory is one chunk per stream.

The one statistics engine, for the health pass and the app's one-tensor statistics (`tensor.py`, the `s`
key): NaN/Inf counted apart, min/max/mean/std over the finite values, at the speed of the page cache. Each float chunk
(fp32 as stored; bf16, fp16 and fp8 widened exactly to fp32 first) costs a handful of passes that stay in
the cache the read just filled:

* min and max, once each, in the stored values: they are exact, and finite exactly when the chunk holds no
  NaN or Inf (numpy's min/max propagate NaN), so the NaN/Inf counting runs only on chunks that hold one (a
  16-bit copy proven to be its master rounded is handed the master's, rounded: `add`'s `bounds`);
* zeros only where min <= 0 <= max (never for `exp_avg_sq`, whose zero rows are then skipped too);
* the sum and the sum of squares as float32 inner products over blocks of `BLOCK` elements (the sums
  einsum's row sums, the squares one BLAS inner product per block, `row_dots`, pieces too small to start
  BLAS threads), the block sums added in float64 per `GROUP` (1 MiB of fp32) and the groups combined in float64
  in stream order (Chan's update for mean and variance). Every decision below (shift, exact path) is made
  per group too, so a stream's figures are the same bits whatever chunk size (a multiple of GROUP) the
  number of workers gave it. Values are shifted by an fp32 number near their mean only when mean² > 2·var (a spread
  well under the values' size: rare for weights and moments, `exp_avg_sq` included, whose std is about
  their mean or more; layer norms' weights near 1 take it), so the variance is never a difference of much
  larger numbers.

Precision (worst case, whatever the data; measured errors are 1e-8 relative or less): a float32 sum of
`BLOCK` + 1 rounded terms errs by at most GAMMA = (BLOCK + 1)·2⁻²⁴ ≈ 1.53e-5 of the sum of their magnitudes,
the float64 steps add nothing visible. So the L2 norm (and `--against`'s delta norm) is within a relative
`NORM_REL`, the standard deviation within a relative `STD_REL` (shifting keeps the variance's cancellation to
a factor 9.6) and the mean within `MEAN_SPAN` · (max - min). Counts, min, max and abs-max are exact. Groups
whose float32 squares would overflow (|x| > 1.8e19) or that hold NaN/Inf, and integer or float64 tensors,
take an exact float64 path instead. numpy releases the GIL in every call used here (bf16 is widened by a
shift of its bits: ml_dtypes' cast is a legacy user cast, which numpy runs holding the GIL), so several
streams run on several cores. bf16 arrives as its bits (`bits_dtype`; `bits` views ml_dtypes' bfloat16 so)
and is only widened by that shift (`widened`, `widen_into`): no ml_dtypes import (~0.7 CPU-s) but for fp8.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import numpy as np

from inspector.convert.cast import widen_bf16
from inspector.format.dtypes import bits_dtype
from inspector.health.stats import Stats
from inspector.health.zero_rows import ZeroRows

Array = np.ndarray[Any, Any]

BLOCK = 256  # elements summed in float32 before the float64 accumulation
GROUP = 1 << 18  # the unit sums are folded in by (1 MiB of fp32): every chunk a worker reads is a multiple
EXACT_BLOCK = 1 << 13  # the exact path's float64 values at a time (64 KiB): a chunk of NaN, as a diverged
# run holds everywhere, costs no more memory than a sound one whatever the chunk size
SHIFT_RATIO = 2.0  # shift the values when mean² > 2·var (in the shifted values' terms)
GAMMA = (BLOCK + 1) * 2.0**-24 / (1 - (BLOCK + 1) * 2.0**-24)  # the float32 block sums' relative bound
NORM_REL = 1e-5  # ≥ GAMMA / 2: the sum of squares' bound, halved by the square root (Σx² is never shifted)
STD_REL = 8e-5  # ≥ 9.6·GAMMA / 2: M2 per chunk (1 + r + 2·sqrt(r(1 + r)))·GAMMA = 7.9·GAMMA at r = mean²/var
# = 2, the chunk means sqrt(1 + r)·GAMMA·M2 = 1.73·GAMMA·M2; the square root halves the sum
MEAN_SPAN = 1.6e-5  # ≥ GAMMA: |mean error| ≤ GAMMA · rms(x - shift) ≤ GAMMA · (max - min)
_F32 = np.dtype(np.float32)
BF16 = bits_dtype("bfloat16")  # bf16's bits: 'V2', which numpy has no arithmetic for


def exact_blocks(*arrays: Array) -> Iterator[tuple[Array, ...]]:
    """Arrays of one length cut in step into pieces of EXACT_BLOCK: the slow float64 paths' unit, so their
    scratch and temporaries are one block's whatever the chunk."""
    for i in range(0, arrays[0].shape[0], EXACT_BLOCK):
        yield tuple(a[i : i + EXACT_BLOCK] for a in arrays)


def groups(n: int) -> Iterator[tuple[int, int]]:
    """(start, stop) of each GROUP of a chunk of `n` elements (the last one may be shorter)."""
    for i in range(0, n, GROUP):
        yield i, min(n, i + GROUP)


class Buffers:
    """One worker's scratch for the reductions, allocated once: `chunk` float32 values twice (the widened
    chunk, and the shifted copy or difference, whose bytes double as the zero mask once the sums are
    taken), EXACT_BLOCK float64 values for the exact path and the block sums."""

    def __init__(self, chunk: int) -> None:
        self.wide = np.empty(chunk, np.float32)
        self.shifted = np.empty(chunk, np.float32)
        self.mask = self.shifted.view(np.bool_)  # 4 x chunk flags; never in use while `shifted` is
        self.f64 = np.empty(min(chunk, EXACT_BLOCK), np.float64)
        self.blocks = np.empty((2, chunk // BLOCK + 1), np.float32)  # Σv² and Σv of each block: folded
        self.squares, self.sums = self.blocks  # in one call (`_fold`)


def bits(x: Array) -> Array:
    """`x`, bf16 viewed as its bits (BF16): ml_dtypes' bfloat16 is the one other 2-byte dtype of kind 'V'."""
    dt = x.dtype
    return x.view(BF16) if dt.kind == "V" and dt.itemsize == 2 and dt != BF16 else x


def widened(x: Array, buf: Buffers) -> Array | None:
    """`x` as float32 without rounding (itself if it is float32), or None for dtypes that need the exact
    path (float64, integers, bool). Floats of 16 bits or fewer hold nothing float32 cannot."""
    if x.dtype == _F32:
        return x
    x = bits(x)
    if x.dtype == BF16:  # the bits shifted up: exact, and a plain integer ufunc that releases the GIL
        y = buf.wide[: x.shape[0]]  # (ml_dtypes' casts are legacy user casts, which numpy runs holding it)
        widen_bf16(x.view(np.uint16), y.view(np.uint32))
        return y
    if x.dtype.itemsize <= 2 and x.dtype.kind in "fV":  # fp16; fp8 (ml_dtypes' types are kind 'V' or 'f')
        y = buf.wide[: x.shape[0]]
        np.copyto(y, x, casting="unsafe")
        return y
    return None


def widen_into(x: Array, out: Array) -> Array:
    """`x`'s values, exactly, into the float32 or float64 array `out` of its length (returned): numpy's
    cast, bf16 by its bits shifted up (a float32 copy of `x` on the way to float64: callers pass a block)."""
    x = bits(x)
    if x.dtype != BF16:
        np.copyto(out, x, casting="unsafe")
    elif out.dtype == _F32:
        widen_bf16(x.view(np.uint16), out.view(np.uint32))
    else:
        wide = np.left_shift(x.view(np.uint16), 16, dtype=np.uint32).view(np.float32)
        with np.errstate(invalid="ignore"):  # a signalling NaN stays a NaN, quietly
            np.copyto(out, wide, casting="unsafe")
    return out


def _vecdot_rows(rows: Array, out: Array) -> None:
    np.vecdot(rows, rows, out=out)


def _matmul_rows(rows: Array, out: Array) -> None:
    np.matmul(rows[:, None, :], rows[:, :, None], out=out.reshape(-1, 1, 1))


# each row's float32 inner product with itself, one BLAS sdot a row (single-threaded at BLOCK elements).
# numpy 2's vecdot runs the same sdot as a batched matmul of 1 x BLOCK by BLOCK x 1 (the same bits, checked
# in tests/health) with less set-up per row: 71 against 58 GB/s here; numpy 1.x has only the matmul
row_dots = _vecdot_rows if hasattr(np, "vecdot") else _matmul_rows


def group_sums(v: Array, buf: Buffers, linear: bool = True) -> tuple[list[float], list[float]]:
    """(Σv, Σv²) of each GROUP of a float32 array: float32 inner products over blocks of BLOCK (`row_dots`
    for the squares, einsum's row sums: one pass each, never BLAS threads), each group's block sums added
    in float64 (Σv all 0.0 when not `linear`). Not finite where a float32 block sum overflows: an answer
    (the caller takes the exact path), so callers hold `np.errstate(over="ignore")`, once for all their
    calls (each one costs a microsecond). A group's figures depend on its own values only, never on the
    chunk around it."""
    n = v.shape[0]
    full = n - n % BLOCK
    nb = full // BLOCK
    count = max(1, -(-n // GROUP))
    s1, s2 = [0.0] * count, [0.0] * count
    if nb:
        rows = v[:full].reshape(nb, BLOCK)
        row_dots(rows, buf.squares[:nb])
        if linear:
            np.einsum("ij->i", rows, out=buf.sums[:nb])
        folded = _fold(buf.blocks if linear else buf.blocks[:1], nb)
        s2[: len(folded[0])] = folded[0]  # a tail past them: a group of its own
        if linear:
            s1[: len(folded[1])] = folded[1]
    if full < n:  # the stream's tail: fewer than BLOCK elements, the same bound
        t = v[full:]
        s2[-1] += float(np.dot(t, t))
        if linear:
            s1[-1] += float(np.add.reduce(t, dtype=np.float64))
    return s1, s2


def _fold(blocks: Array, nb: int) -> list[list[float]]:
    """Each row's first `nb` block sums (the squares', and the sums' where there are two rows) added in
    float64 per GROUP: every whole group of both rows in one reduction (the same pairwise sum, the same
    bits, as a reduction per group and row), the last group's part alone. The calls are few: under the GIL
    each one is a handoff between workers, and in the pass each costs 3-8 µs, not a micro-benchmark's 1.5."""
    per = GROUP // BLOCK
    whole = nb - nb % per
    out: list[list[float]] = [[] for _ in range(blocks.shape[0])]
    if whole:
        out = np.add.reduce(
            blocks[:, :whole].reshape(blocks.shape[0], -1, per), axis=2, dtype=np.float64
        ).tolist()
    if whole < nb:
        tails = np.add.reduce(blocks[:, whole:nb], axis=1, dtype=np.float64).tolist()
        for row, tail in zip(out, tails, strict=True):
            row.append(tail)
    return out


def block_sums(v: Array, buf: Buffers, linear: bool = True) -> tuple[float, float]:
    """(Σv, Σv²) of a float32 array: its groups' sums added in order."""
    with np.errstate(over="ignore"):
        s1, s2 = group_sums(v, buf, linear)
    return sum(s1), sum(s2)


class Accumulator:
    """The statistics of one stream, fed its chunks in their stored dtype (see the module docstring).

    Sums are folded in GROUP by GROUP in stream order, and the shift and the exact path are chosen per
    group: chunks that are multiples of GROUP (as the workers' chunks are) give the same bits whatever
    their size."""

    __slots__ = (
        "_rows",
        "hi",
        "k",
        "last",
        "lo",
        "m2",
        "mean",
        "n",
        "nan",
        "neg_inf",
        "numel",
        "pos_inf",
        "sq",
        "zeros",
    )

    def __init__(self, row: int = 0) -> None:
        self.numel = self.n = self.nan = self.pos_inf = self.neg_inf = self.zeros = 0
        self.lo, self.hi = math.inf, -math.inf
        self.k = 0.0  # the current shift, a float32 number
        self.mean = self.m2 = self.sq = 0.0  # running mean and M2 (Chan), sum of squares
        self._rows = ZeroRows(row) if row else None
        self.last: tuple[float, float] | None = None  # the last chunk's (min, max), when it was all finite

    def add(self, x: Array, buf: Buffers, bounds: tuple[float, float] | None = None) -> bool:
        """Fold in one chunk `x` (any numeric dtype; `buf` holds at least len(x)). True when every value of
        the chunk is finite. A complex chunk is measured by its modulus |z|: its norm is then the tensor's
        true L2 norm (a cast to real would drop every imaginary part). `bounds`: the chunk's (min, max),
        finite, where the caller knows them exactly (a 16-bit copy proven to be its master rounded): two
        passes fewer."""
        n = x.shape[0]
        self.last = None
        if not n:
            return True
        if x.dtype.kind == "c":
            x = np.abs(x)  # complex64 -> float32, complex128 -> float64; NaN and Inf parts stay NaN and Inf
        self.numel += n
        y = widened(x, buf)
        if y is None:
            return self._exact(x, buf)
        with np.errstate(over="ignore"):  # overflows are answers (`group_sums`, `_sums`), never warnings
            if self._finite(y, buf, bounds):
                return True
            finite = True  # a NaN (min/max propagate it) or an Inf somewhere: group by group
            for i, j in groups(n):
                if not self._finite(y[i:j], buf):
                    finite &= self._exact(y[i:j], buf)
        self.last = None  # a group's, not the chunk's
        return finite

    def _finite(self, y: Array, buf: Buffers, bounds: tuple[float, float] | None = None) -> bool:
        """Fold in a float32 chunk if it is all finite (min and max are, exactly then); False, touching
        nothing, if it is not."""
        if bounds is not None:
            lo, hi = bounds
        else:
            lo, hi = float(np.minimum.reduce(y)), float(np.maximum.reduce(y))
        if not (math.isfinite(lo) and math.isfinite(hi)):
            return False
        self.last = (lo, hi)
        self.lo, self.hi = min(self.lo, lo), max(self.hi, hi)
        self._sums(y, buf)
        self._zeros(y, buf, lo, hi)  # after the sums: the mask is `shifted`'s bytes
        return True

    def _zeros(self, y: Array, buf: Buffers, lo: float, hi: float) -> None:
        """Count the zeros (and the zero rows) of a finite float32 chunk; none unless min <= 0 <= max."""
        n = y.shape[0]
        zeros = 0
        if lo <= 0.0 <= hi:
            m = buf.mask[:n]
            np.equal(y, 0.0, out=m)
            # whether any flag is set, 8 at a time (3.5 µs a Mi against count_nonzero's 10): most chunks
            # that straddle zero hold none, and only those that hold one are counted
            flags = m.view(np.uint64) if n % 8 == 0 else m
            if np.maximum.reduce(flags):
                zeros = int(np.count_nonzero(m))
        self.zeros += zeros
        if self._rows is not None:
            if zeros:
                self._rows.add(y, buf.mask[:n])
            else:
                self._rows.skip(n)

    def _sums(self, y: Array, buf: Buffers) -> None:
        """Fold in the sums of a finite float32 chunk group by group, each as (shift, Σ(y - shift),
        Σ(y - shift)², Σy²). The shift moves near a group's mean while the current one leaves mean² >
        var / 4 (at most twice per group); a group whose float32 sums overflow, or that no float32 shift
        fits (values a few ulps apart), takes the exact path (its zeros are counted by the caller)."""
        n = y.shape[0]
        start, tries = 0, 0
        while start < n:
            k = self.k
            part = y[start:]
            # y - k beyond float32 (no warning: `add` holds errstate): its square overflows too, see below
            v = part if k == 0.0 else np.subtract(part, np.float32(k), out=buf.shifted[: n - start])
            s1, s2 = group_sums(v, buf)
            sq = s2 if k == 0.0 else group_sums(part, buf, linear=False)[1]
            for a, b, c in zip(s1, s2, sq, strict=True):
                m = min(GROUP, n - start)
                if (
                    math.isfinite(b)
                    and math.isfinite(c)
                    and a * a * (1.0 + SHIFT_RATIO) <= SHIFT_RATIO * m * b
                ):
                    self._combine(m, k + a / m, max(b - a * a / m, 0.0), c)
                    start, tries = start + m, 0
                    continue
                new = float(np.float32(k + a / m)) if math.isfinite(b) and math.isfinite(c) else k
                if new == k or tries >= 2:
                    self._exact(y[start : start + m], buf, counted=True)  # `shifted` is scratch there
                    self.k = new
                    start, tries = start + m, 0
                else:
                    self.k, tries = new, tries + 1
                break  # the rest again, with the new shift (or after the exact path)

    def _combine(self, n: int, mean: float, m2: float, sq: float) -> None:
        """Chan's parallel update: this stream's (count, mean, M2) with a chunk's."""
        total = self.n + n
        d = mean - self.mean
        self.mean += d * n / total
        self.m2 += m2 + d * d * self.n * n / total
        self.n = total
        self.sq += sq

    def _exact(self, x: Array, buf: Buffers, counted: bool = False) -> bool:
        """Chunks that hold NaN/Inf, overflow float32, or are not float: float64 throughout, two passes for
        the variance, EXACT_BLOCK values at a time. True when every value is finite. `counted`: zeros and
        zero rows are counted already."""
        finite = True
        for (block,) in exact_blocks(x):
            finite &= self._exact_block(block, buf, counted)
        return finite

    def _exact_block(self, x: Array, buf: Buffers, counted: bool) -> bool:
        n = x.shape[0]
        f = buf.f64[:n]
        with np.errstate(invalid="ignore"):  # a signalling NaN stays a NaN, quietly
            np.copyto(f, x, casting="unsafe")
        m = buf.mask[:n]
        if not counted:
            np.equal(f, 0.0, out=m)
            self.zeros += int(np.count_nonzero(m))
            if self._rows is not None:
                self._rows.add(f, m)
        np.isfinite(f, out=m)
        finite = int(np.count_nonzero(m))
        g = f
        if finite < n:
            nan, pos_inf = int(np.count_nonzero(np.isnan(f))), int(np.count_nonzero(np.isposinf(f)))
            self.nan += nan
            self.pos_inf += pos_inf
            self.neg_inf += n - finite - nan - pos_inf
            if not finite:
                return False
            g = f[m]  # a copy bounded by one block; only blocks holding NaN/Inf pay for it
        if x.dtype.kind in "iub":  # integers: min/max in the stored type, exact beyond 2**53
            lo, hi = float(x.min()), float(x.max())
        else:
            lo, hi = float(g.min()), float(g.max())
        self.lo, self.hi = min(self.lo, lo), max(self.hi, hi)
        sq = float(np.einsum("i,i->", g, g))
        mean = float(np.add.reduce(g)) / finite
        g -= mean  # scratch, or the copy
        self._combine(finite, mean, float(np.einsum("i,i->", g, g)), sq)
        return finite == n

    def result(self) -> Stats:
        n = self.n
        return Stats(
            numel=self.numel,
            nan=self.nan,
            pos_inf=self.pos_inf,
            neg_inf=self.neg_inf,
            zeros=self.zeros,
            minimum=self.lo if n else math.nan,
            maximum=self.hi if n else math.nan,
            absmax=max(abs(self.lo), abs(self.hi)) if n else math.nan,
            mean=self.mean if n else math.nan,
            std=math.sqrt(max(self.m2 / n, 0.0)) if n else math.nan,
            norm=math.sqrt(max(self.sq, 0.0)),
            zero_rows=self._rows.count if self._rows is not None else None,
        )
