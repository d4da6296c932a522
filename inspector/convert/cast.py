"""Dtype casts with numpy + ml_dtypes, bit-identical to torch's `.to(dtype)` on the CPU.

Every non-NaN value (±0, subnormals, ±Inf, values that round to Inf) is rounded to nearest even exactly as
torch rounds it; tests/convert/test_cast.py proves it against torch over every 16-bit pattern and over edge and
random fp32 inputs. float64 and fp8 sources go through float32 first, as torch's kernels do.

NaNs stay NaNs. Their exact bits follow torch's vectorised x86 kernels (AVX2/AVX512, what torch runs on any
x86-64 CPU of the last decade): fp32 → bf16 gives 0xFFFF; fp32 → fp16 keeps the sign and the top payload
bits with the quiet bit set (F16C); fp16 → fp32 and bf16 → fp32 keep sign and payload (fp16's with the quiet bit set);
fp16 → bf16 gives 0x7FC0; bf16 → fp16 goes through fp32. torch itself is not consistent here (its scalar
fallback, used for the tail of some loops and on CPUs without AVX2, writes 0x7FC0 / 0x7FFFFFFF), so for NaNs
"identical to torch" can only mean "identical to its main path". The fix-up costs one `isnan` pass, and only
chunks that hold a NaN pay for more.

Large chunks are split over threads: numpy releases the GIL while casting, so on a machine where one core
casts slower than the disk reads (fp16 output: ~0.6 G elements/s per core) the cast scales with cores.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from inspector.format.dtypes import numpy_dtype
from inspector.system.limits import usable_cores

_DIRECT = {"float32", "float16", "bfloat16"}
_PARALLEL_MIN = 1 << 20  # elements; below this a thread hand-off costs more than it saves
_pool: ThreadPoolExecutor | None = None


def cast_threads() -> int:
    """Threads a cast is split over: the cores this process may use, at most 8 (memory bandwidth caps it)."""
    return min(8, usable_cores())


def _executor() -> ThreadPoolExecutor:
    global _pool
    if _pool is None:
        _pool = ThreadPoolExecutor(cast_threads(), thread_name_prefix="zi-cast")
    return _pool


def cast_into(src: np.ndarray[Any, Any], out: np.ndarray[Any, Any], threads: int | None = None) -> None:
    """Write `src` cast to `out.dtype` into `out` (1-D arrays of equal length), as torch's `.to()` would."""
    n = src.shape[0]
    threads = cast_threads() if threads is None else threads
    if threads > 1 and n >= _PARALLEL_MIN:
        step = -(-n // threads)
        step += -step % 4096  # page-aligned-ish pieces
        parts = [(i, min(n, i + step)) for i in range(0, n, step)]
        list(_executor().map(lambda p: _cast(src[p[0] : p[1]], out[p[0] : p[1]]), parts))
    else:
        _cast(src, out)


def _cast(src: np.ndarray[Any, Any], out: np.ndarray[Any, Any]) -> None:
    s_name, o_name = _name(src.dtype), _name(out.dtype)
    if s_name == o_name:
        out[...] = src
        return
    floating_src = src.dtype.kind == "f" or s_name == "bfloat16" or s_name.startswith("float8")
    with np.errstate(all="ignore"):  # overflow to Inf and NaN are values here, not errors
        if s_name == "float32" and o_name == "bfloat16" and integer_rounding():
            _f32_to_bf16(src, out)
        elif s_name == "bfloat16" and o_name == "float32":  # exact: the bits shifted up
            widen_bf16(src.view(np.uint16), out.view(np.uint32))
        elif floating_src and o_name in _DIRECT and s_name not in _DIRECT:
            np.copyto(out, src.astype(np.float32), casting="unsafe")  # torch rounds through fp32
        else:
            np.copyto(out, src, casting="unsafe")
        if floating_src and o_name in _DIRECT and s_name in _DIRECT:
            nan = np.isnan(src)
            if nan.any():
                _fix_nans(src, out, nan, s_name, o_name)


def widen_bf16(src: np.ndarray[Any, Any], out: np.ndarray[Any, Any]) -> None:
    """bf16 bits (uint16) into `out` (uint32 of the same length) as fp32's bits: exact, NaNs keep sign and
    payload. A widening copy, then a shift in place: both plain SIMD loops (a shift that casts on the way,
    `left_shift(src, 16, dtype=uint32)`, runs numpy's buffered cast: 1.3x the time at 1 Mi elements here,
    2.3x at 4 Mi)."""
    np.copyto(out, src, casting="unsafe")
    np.left_shift(out, 16, out=out)


def integer_rounding() -> bool:
    """Whether fp32 -> bf16 rounds in integer ufuncs (GIL-free, 5 passes over a cached block) rather than in
    ml_dtypes' one cast (which holds the GIL). The integer path, always: it is the faster one on one core too
    (measured on this 2-core AMD EPYC with AVX-512, per 2 M elements 2.0 against 2.9 ms, per 16 M 12.4-13.1
    against 14.6-15.0 ms; an earlier machine had it the other way round, 9.5 against 5.8 ms per 16 M), and it
    needs no ml_dtypes, whose import costs ~0.8 CPU-seconds (`cast_raw`). Both are bit-identical to torch
    (tests/convert/test_cast.py runs each)."""
    global _integer
    if _integer is None:
        _integer = True
    return _integer


_integer: bool | None = None
_BLOCK = 1 << 16  # elements per integer rounding step: its uint32 scratch (256 KiB) stays in the cache
_local = threading.local()


def _f32_to_bf16(src: np.ndarray[Any, Any], out: np.ndarray[Any, Any]) -> None:
    """fp32 -> bf16 rounded to nearest even on the bits, as torch's `round_to_nearest_even` does for every
    non-NaN value (±0, subnormals, overflow to Inf), NaN lanes left to `_fix_nans`. Plain integer ufuncs,
    which release the GIL: ml_dtypes' cast is a legacy user cast, which numpy runs holding it, so threads
    casting with it take turns."""
    need = min(_BLOCK, src.shape[0])  # a thread casting small blocks keeps a small scratch
    t: np.ndarray[Any, Any] | None = getattr(_local, "scratch", None)
    if t is None or t.shape[0] < need:
        t = _local.scratch = np.empty(need, np.uint32)
    u, o = src.view(np.uint32), out.view(np.uint16)
    for i in range(0, u.shape[0], _BLOCK):
        x = u[i : i + _BLOCK]
        k = t[: x.shape[0]]
        np.right_shift(x, 16, out=k)
        np.bitwise_and(k, 1, out=k)  # the lowest kept bit: ties go to even
        np.add(k, 0x7FFF, out=k)
        np.add(k, x, out=k)
        np.right_shift(k, 16, out=o[i : i + _BLOCK], casting="unsafe")


def _bf16_to_f16(src: np.ndarray[Any, Any], out: np.ndarray[Any, Any]) -> None:
    """bf16 bits -> fp16 as torch casts it, through fp32: each block widened exactly (the bits shifted up)
    into this thread's scratch, rounded once by numpy, NaNs fixed as fp32's (the same bits as bf16's own
    fix-up: sign, quiet bit, the top payload bits). No ml_dtypes."""
    need = min(_BLOCK, src.shape[0])
    t: np.ndarray[Any, Any] | None = getattr(_local, "scratch", None)
    if t is None or t.shape[0] < need:
        t = _local.scratch = np.empty(need, np.uint32)
    for i in range(0, src.shape[0], _BLOCK):
        b = src[i : i + _BLOCK]
        f = t[: b.shape[0]].view(np.float32)
        widen_bf16(b, f.view(np.uint32))
        o = out[i : i + _BLOCK]
        with np.errstate(all="ignore"):  # beyond fp16's range is Inf, a value here
            np.copyto(o, f, casting="unsafe")
        nan = np.isnan(f)
        if nan.any():
            _fix_nans(f, o, nan, "float32", "float16")


def _name(dt: np.dtype[Any]) -> str:
    return "bfloat16" if dt.name == "bfloat16" else dt.name


def _fix_nans(
    src: np.ndarray[Any, Any], out: np.ndarray[Any, Any], nan: np.ndarray[Any, Any], s: str, o: str
) -> None:
    """Rewrite NaN lanes with the bits torch's vectorised kernels produce (see the module docstring)."""
    idx = np.flatnonzero(nan)
    if s == "float32":
        u = src.view(np.uint32)[idx]
        if o == "bfloat16":
            out.view(np.uint16)[idx] = 0xFFFF
        elif o == "float16":
            out.view(np.uint16)[idx] = ((u >> 16) & 0x8000) | 0x7E00 | ((u >> 13) & 0x3FF)
    elif s == "float16":
        h = src.view(np.uint16)[idx].astype(np.uint32)
        if o == "float32":
            out.view(np.uint32)[idx] = ((h & 0x8000) << 16) | 0x7FC00000 | ((h & 0x3FF) << 13)
        elif o == "bfloat16":
            out.view(np.uint16)[idx] = 0x7FC0
    elif s == "bfloat16":
        b = src.view(np.uint16)[idx].astype(np.uint32)
        if o == "float16":  # (to fp32 numpy already shifts the bits, as torch does)
            out.view(np.uint16)[idx] = (b & 0x8000) | 0x7E00 | ((b & 0x7F) << 3)


def cast_raw(
    src: np.ndarray[Any, Any], src_dtype: str, out: np.ndarray[Any, Any], out_dtype: str, n: int
) -> None:
    """Cast the first `n` elements of the raw byte buffer `src` (as `src_dtype`) into the raw byte buffer
    `out` (as `out_dtype`) on this thread, as `cast_into` would. fp32 -> bf16 (ZeRO's masters to a bf16
    output, the common conversion), bf16 -> fp32 and bf16 -> fp16 work on the bits and never import
    ml_dtypes: that import registers its ufunc loops one by one, ~0.8 CPU-seconds and 1.4 s of wall on this
    2-core machine, more than casting all of a 500M model, and a conversion paid it inside a worker holding
    the GIL and the import lock."""
    if src_dtype == "float32" and out_dtype == "bfloat16" and integer_rounding():
        s, o = src[: n * 4].view(np.float32), out[: n * 2].view(np.uint16)
        _f32_to_bf16(s, o)  # integer ufuncs only: nothing to overflow or warn about
        nan = np.isnan(s)
        if nan.any():
            _fix_nans(s, o, nan, "float32", "bfloat16")
        return
    if src_dtype == "bfloat16" and out_dtype == "float32":  # bf16 frozen weights and buffers to an fp32
        # output: exact, the bits shifted up (NaNs keep sign and payload, as torch's and `_cast`'s)
        widen_bf16(src[: n * 2].view(np.uint16), out[: n * 4].view(np.uint32))
        return
    if src_dtype == "bfloat16" and out_dtype == "float16":
        _bf16_to_f16(src[: n * 2].view(np.uint16), out[: n * 2].view(np.float16))
        return
    cast_into(typed(src, src_dtype, n), typed(out, out_dtype, n), threads=1)


def typed(buf: np.ndarray[Any, Any], dtype: str, count: int) -> np.ndarray[Any, Any]:
    """The first `count` elements of a raw byte buffer, viewed as `dtype` (no copy)."""
    dt = numpy_dtype(dtype)
    return buf[: count * dt.itemsize].view(dt)
