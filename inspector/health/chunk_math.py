"""The arithmetic a health worker does on one chunk: the module copy checked against its master cast (bit
for bit, torch's rounding), `--against`'s change and norms group by group, NaN and Inf counted; and the
buffers one worker owns for its whole life (`Scratch`). Pure numpy on arrays the stream has read: bf16 as
its bits (numerics.BF16), cast and widened on them; ml_dtypes only for the rare casts numpy cannot do on the
bits (a master that is not fp32 with a bf16 copy, a bf16 master with another copy), imported then."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from inspector.convert.cast import cast_into, cast_raw
from inspector.convert.reader import buffer
from inspector.format.dtypes import numpy_dtype
from inspector.health.differences import max_abs_difference
from inspector.health.numerics import (
    BF16,
    EXACT_BLOCK,
    Array,
    Buffers,
    bits,
    exact_blocks,
    group_sums,
    groups,
    widen_into,
)

F32 = np.dtype(np.float32)
PLAIN_CAST = (BF16, np.dtype(np.float16), F32)  # numpy's cast of finite fp32 is torch's (bf16: cast_raw's)


class Scratch:
    """One worker thread's buffers, allocated once (pages are touched only as far as a chunk's dtype needs):
    raw bytes for up to three streams read in step, the reductions' buffers (whose shifted values also hold
    `--against`'s change and the module check's bit differences: the chunk's reductions are done by then),
    and EXACT_BLOCK float64 values and a cast block for the slow comparisons (the module copy's,
    `--against`'s)."""

    def __init__(self, chunk: int) -> None:
        self.chunk = chunk
        self.raw = [buffer(chunk * 8) for _ in range(3)]  # on a page: reads land fast (reader.buffer)
        self.buf = Buffers(chunk)
        exact = min(chunk, EXACT_BLOCK)
        self.f64 = [np.empty(exact, np.float64) for _ in range(2)]
        self.tmp = np.empty(exact, np.float64)
        self.cast = np.empty(exact * 8, np.uint8)


def module_diff(
    master: Array, module: Array, s: Scratch, finite: bool, inexact: bool = False
) -> tuple[float, int]:
    """(largest difference, differing elements) of the module copy from the master cast to its dtype,
    as DeepSpeed casts it after each step (bit-exact torch rounding, convert/cast.py).

    A finite fp32 master with a bf16 copy (the common case) is checked whole without a cast, in integer
    ufuncs that release the GIL (ml_dtypes' casts hold it: numpy runs legacy user casts with the Python
    API): the copy widened (s.buf.wide, from its statistics) is the master rounded to nearest even
    exactly when their bits, as int32, differ by less than 0x8000 everywhere, or by exactly 0x8000 (a
    tie) where the copy's last bit is even. Other chunks are cast whole (numpy's rounding of finite
    fp32 is torch's) into free scratch and their bits compared; only blocks that differ, and chunks
    holding NaN (whose bits need torch's fix-ups), go block by block through float64 copies. `inexact`:
    the check without a cast has already failed. Where that check passes, the master's bytes are spent
    (`rounds_to`)."""
    master, module = bits(master), bits(module)
    n = master.shape[0]
    size = module.dtype.itemsize
    uint = np.dtype(f"u{size}") if size in (2, 4, 8) else None
    plain = finite and master.dtype == F32 and module.dtype in PLAIN_CAST and uint is not None
    if plain and module.dtype == BF16 and not inexact and rounds_to(master, module, s.buf):
        return 0.0, 0
    whole: Array | None = None
    if plain and uint is not None:
        raw = s.buf.shifted[:n].view(np.uint8)[: n * size]
        if module.dtype == BF16:
            whole = cast_to(master, BF16, raw)
        else:
            whole = raw.view(module.dtype)
            with np.errstate(over="ignore"):  # a master beyond fp16's range is Inf in the copy: no warning
                np.copyto(whole, master, casting="unsafe")
        differs = s.buf.wide[:n].view(np.bool_)[:n]
        np.not_equal(whole.view(uint), module.view(uint), out=differs)
        if not differs.any():
            return 0.0, 0
    worst, differing = 0.0, 0
    for i in range(0, n, EXACT_BLOCK):
        x, m = master[i : i + EXACT_BLOCK], module[i : i + EXACT_BLOCK]
        k = m.shape[0]
        c = whole[i : i + k] if whole is not None else cast_to(x, module.dtype, s.cast)
        # same bits, same values (NaN payloads aside, which the float64 comparison takes)
        if uint is not None and np.array_equal(c.view(uint), m.view(uint)):
            continue
        a, b = widen_into(m, s.f64[0][:k]), widen_into(c, s.f64[1][:k])
        d, count = max_abs_difference(a, b, s.tmp)
        worst, differing = max(worst, d), differing + count
    return worst, differing


def cast_to(x: Array, dtype: np.dtype[Any], raw: Array) -> Array:
    """`x` cast to `dtype` as torch's `.to()` casts it (convert/cast.py) into the bytes `raw`, viewed as
    `dtype`. fp32 to bf16 on the bits (`cast_raw`: DeepSpeed's copies, no ml_dtypes); other casts to or from
    bf16 through ml_dtypes' type (imported then: numpy has no bf16)."""
    k = x.shape[0]
    if dtype == BF16 and x.dtype == F32:
        cast_raw(x.view(np.uint8), "float32", raw, "bfloat16", k)
        return raw[: 2 * k].view(BF16)
    if x.dtype == dtype:  # the same type (a bf16 master's bf16 copy): its bytes, as cast_into copies them
        c = raw[: k * dtype.itemsize].view(dtype)
        c[...] = x
        return c
    c = raw[: k * dtype.itemsize].view(_ml(dtype))
    cast_into(x.view(_ml(x.dtype)), c, threads=1)
    return bits(c)


def _ml(dtype: np.dtype[Any]) -> np.dtype[Any]:
    """`dtype`, BF16 as ml_dtypes' bfloat16 (importing it) for numpy's casts."""
    return numpy_dtype("bfloat16") if dtype == BF16 else dtype


def rounded_bounds(bounds: tuple[float, float] | None) -> tuple[float, float] | None:
    """A finite fp32 chunk's (min, max) rounded to bf16 (to nearest even, as the copy is): the copy's own
    (min, max) exactly where the copy is that chunk rounded, rounding being monotone. None where either
    rounds to Inf, or to zero (whose sign the copy's own minimum would choose)."""
    if bounds is None:
        return None
    out = []
    for v in bounds:
        bits = int(np.float32(v).view(np.uint32))
        bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
        r = float(np.uint32(bits).view(np.float32))
        if not math.isfinite(r) or r == 0.0:
            return None
        out.append(r)
    return out[0], out[1]


TIE_ROW = 1024  # elements a row of the tie search: its row-wise extremes cost about what whole ones do, and
# a tied row's search is short (the demo's synthetic masters hold ~155 ties a Mi: with rows of 4,096 a third
# of each chunk was searched, 0.09 ms of the check's 0.19 a Mi here; ZeRO-2 demo health 1.11 -> 1.05 s)
TIE_SHARE = 4  # tied rows are searched as rows while they are at most 1/TIE_SHARE of a chunk's, else whole


def rounds_to(master: Array, module: Array, buf: Buffers) -> bool:
    """Whether a bf16 chunk is its finite fp32 master rounded to nearest even, bit for bit (buf.wide holds
    the copy widened). Integer passes, no cast: master - copy on the bits lies within ±0x8000 everywhere,
    and at exactly ±0x8000 (a tie) the copy's last bit is even; a sign change wraps far outside.

    The difference is taken in place over the master's bits, whose statistics are folded in by then: a
    third chunk-sized buffer made the pass's working set (master, widened copy, difference: 3 MiB a Mi
    elements) overflow a 2 MiB L2, and an out-of-place subtract there ran at 91 µs a MiB against 38 in
    place. Where the copy rounds exactly (nearly always) the master is left as that difference: the caller
    reads it no more. Otherwise it is restored, exactly (integer wrap-around inverts), for the comparison
    that measures the difference.

    A master's low bits are a tie 1 time in 65,536 (~16 a Mi), so nearly every chunk holds one: the
    extremes are taken row by row (TIE_ROW elements) and only the rows whose extreme is a tie are searched,
    where a whole-chunk search cost two more passes."""
    n = master.shape[0]
    d, w = master.view(np.int32), buf.wide[:n].view(np.int32)
    np.subtract(d, w, out=d)
    exact = _within_ties(d, module)
    if not exact:
        np.add(d, w, out=d)  # the master again, bit for bit
    return exact


def _within_ties(d: Array, module: Array) -> bool:
    """Whether every difference `d` lies within ±0x8000 and every tie's copy is even."""
    n = d.shape[0]
    whole = n - n % TIE_ROW
    rows, odd = d[:whole].reshape(-1, TIE_ROW), module.view(np.uint16)
    tops, bottoms = np.maximum.reduce(rows, axis=1), np.minimum.reduce(rows, axis=1)
    tail = d[whole:]
    top = max(int(tops.max(initial=-(2**31))), int(tail.max(initial=-(2**31))))  # either may be empty
    bottom = min(int(bottoms.min(initial=2**31 - 1)), int(tail.min(initial=2**31 - 1)))
    if top > 0x8000 or bottom < -0x8000:
        return False
    if top < 0x8000 and bottom > -0x8000:
        return True
    tied = np.flatnonzero((tops == 0x8000) | (bottoms == -0x8000))
    if tied.shape[0] * TIE_SHARE > rows.shape[0]:
        return not _odd_tie(d, odd)
    odd_rows = odd[:whole].reshape(-1, TIE_ROW)
    return not (_odd_tie(rows[tied], odd_rows[tied]) or _odd_tie(tail, odd[whole:]))  # copies of tied rows


def _odd_tie(d: Array, odd: Array) -> bool:
    """Whether a tie (|d| = 0x8000) lies where the copy's last bit (of `odd`, its bits) is odd."""
    return bool(d.size) and bool(np.any((np.abs(d) == 0x8000) & (odd & 1)))


def delta_sq(x: Array, o: Array, s: Scratch) -> list[float]:
    """Σ(x - o)² of each GROUP of one chunk of two masters: for fp32 the difference in float32 (exact where
    the two are within a factor 2 of each other, else rounded once) summed as `group_sums` does; float64
    for other dtypes and for a group where float32 overflows. A NaN or Inf left as it was is no change; one
    that appeared is NaN or Inf."""
    x, o = bits(x), bits(o)
    n = x.shape[0]
    fast: list[float] = []
    if x.dtype == F32 and o.dtype == F32:
        d = s.buf.shifted[:n]  # free: this chunk's reductions are folded in already
        with np.errstate(all="ignore"):
            np.subtract(x, o, out=d)
            fast = group_sums(d, s.buf, linear=False)[1]
    out = []
    for g, (i, j) in enumerate(groups(n)):
        if fast and math.isfinite(fast[g]):
            out.append(fast[g])
            continue
        total = 0.0
        for xs, os_ in exact_blocks(x[i:j], o[i:j]):
            t = s.tmp[: xs.shape[0]]
            if BF16 in (xs.dtype, os_.dtype):  # numpy has no bf16 arithmetic: both in float64, exactly
                xs, os_ = widen_into(xs, s.f64[0][: t.shape[0]]), widen_into(os_, s.f64[1][: t.shape[0]])
            with np.errstate(invalid="ignore"):
                np.subtract(xs, os_, out=t, dtype=np.float64)  # exact for fp32 inputs
            if not math.isfinite(float(np.einsum("i,i->", t, t))):  # unchanged is no change, NaN or Inf
                t[(xs == os_) | (np.isnan(xs) & np.isnan(os_))] = 0.0
            total += float(np.einsum("i,i->", t, t))
        out.append(total)
    return out


def nonfinite(x: Array) -> int:
    """NaN and Inf in one chunk: two reductions (min and max show either), a count only where one is; bf16
    by its bits (every exponent bit set). Every float kind counts: fp8 is ml_dtypes' kind 'V' (e4m3fn and
    the fnuz ones) or 'f' (e5m2), and an fp8 master's NaN once went uncounted for the former."""
    x = bits(x)
    if x.dtype == BF16:
        return int(np.count_nonzero(np.bitwise_and(x.view(np.uint16), 0x7F80) == 0x7F80))
    if x.dtype.kind not in "fV":
        return 0
    with np.errstate(invalid="ignore"):
        lo, hi = float(np.minimum.reduce(x)), float(np.maximum.reduce(x))
    if math.isfinite(lo) and math.isfinite(hi):
        return 0
    return int(x.shape[0] - np.count_nonzero(np.isfinite(x)))


def sum_sq(x: Array, s: Scratch) -> list[float]:
    """Σx² of each GROUP of one chunk (fp32 group sums; float64 where they overflow or for other dtypes)."""
    x = bits(x)
    with np.errstate(over="ignore"):
        fast = group_sums(x, s.buf, linear=False)[1] if x.dtype == F32 else []
    out = []
    for g, (i, j) in enumerate(groups(x.shape[0])):
        if fast and math.isfinite(fast[g]):
            out.append(fast[g])
            continue
        total = 0.0
        for (xs,) in exact_blocks(x[i:j]):
            t = widen_into(xs, s.tmp[: xs.shape[0]])
            total += float(np.einsum("i,i->", t, t))
        out.append(total)
    return out


def sqrt(v: float) -> float:
    return float(np.sqrt(v))
