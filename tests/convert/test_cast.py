"""Our numpy/ml_dtypes casts against torch's `.to()`: every 16-bit pattern, edge and random fp32 inputs.

torch is test-only here: the converter never imports it. Non-NaN results must be bit-identical everywhere.
NaN results must be NaN; their bits must equal torch's where torch's vectorised x86 kernels (AVX2/AVX512)
run and are themselves consistent (all pairs but fp16 → fp32, whose scalar tail differs from its body).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from inspector.convert.cast import cast_into, cast_raw
from inspector.format.dtypes import numpy_dtype

torch = pytest.importorskip("torch")


@pytest.fixture(autouse=True, params=[True, False], ids=["integer-rounding", "ml-dtypes-cast"])
def rounding_path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> bool:
    """Every cast test runs with each fp32 -> bf16 path (the integer rounding is the default since it was
    measured faster here, the ml_dtypes cast stays as the other path)."""
    import inspector.convert.cast as cast_mod

    monkeypatch.setattr(cast_mod, "_integer", request.param)
    return bool(request.param)

_UINT = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}
_TORCH_INT = {1: "uint8", 2: "int16", 4: "int32", 8: "int64"}
VECTOR_KERNELS = torch.backends.cpu.get_cpu_capability() in ("AVX2", "AVX512")


def torch_cast(bits: np.ndarray[Any, Any], src: str, out: str) -> np.ndarray[Any, Any]:
    """Cast raw bit patterns with torch; return the result's bit patterns."""
    size_in = numpy_dtype(src).itemsize
    t = torch.from_numpy(bits.view(_UINT[size_in]).copy())
    t = t.view(getattr(torch, src)).to(getattr(torch, out))
    size_out = numpy_dtype(out).itemsize
    return t.view(getattr(torch, _TORCH_INT[size_out])).numpy().view(_UINT[size_out])


def ours(bits: np.ndarray[Any, Any], src: str, out: str, threads: int = 1) -> np.ndarray[Any, Any]:
    o = np.empty(bits.shape[0], numpy_dtype(out))
    cast_into(bits.view(numpy_dtype(src)), o, threads=threads)
    return o.view(_UINT[o.itemsize])


@np.errstate(all="ignore")
def assert_same(bits: np.ndarray[Any, Any], src: str, out: str, exact_nans: bool = True) -> None:
    got, want = ours(bits, src, out), torch_cast(bits, src, out)
    nan_in = np.isnan(bits.view(numpy_dtype(src)).astype(np.float32))
    plain = ~nan_in
    bad = np.flatnonzero(plain & (got != want))
    assert not bad.size, [(hex(int(bits[i])), hex(int(got[i])), hex(int(want[i]))) for i in bad[:5]]
    assert np.isnan(got.view(numpy_dtype(out)).astype(np.float32))[nan_in].all(), "a NaN lost its NaN-ness"
    if exact_nans and VECTOR_KERNELS:
        bad = np.flatnonzero(nan_in & (got != want))
        assert not bad.size, [(hex(int(bits[i])), hex(int(got[i])), hex(int(want[i]))) for i in bad[:5]]


ALL16 = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)


@pytest.mark.parametrize(
    ("src", "out"),
    [
        ("bfloat16", "float32"),
        ("float16", "float32"),
        ("float16", "bfloat16"),
        ("bfloat16", "float16"),
    ],
)
def test_every_16_bit_pattern(src: str, out: str) -> None:
    # fp16 -> fp32: torch's own NaN bits depend on where in the loop the element falls
    assert_same(ALL16, src, out, exact_nans=(src, out) != ("float16", "float32"))


def _edge_fp32() -> np.ndarray[Any, Any]:
    specials = [
        0x00000000,
        0x80000000,
        0x7F800000,
        0xFF800000,  # ±0, ±Inf
        0x7FC00000,
        0xFFC00000,
        0x7F800001,
        0xFF800001,
        0x7FFFFFFF,
        0x7FA00000,
        0x7F812345,  # NaNs
        0x00000001,
        0x807FFFFF,
        0x00800000,
        0x007FFFFF,  # subnormals, smallest normal
        0x7F7FFFFF,
        0xFF7FFFFF,  # ±max: rounds to Inf in bf16 and fp16
        0x477FEFFF,
        0x477FF000,
        0x477FF001,  # around fp16's overflow threshold 65520
        0x33800000,
        0x33000000,
        0x33000001,
        0x387FC000,  # fp16 subnormal rounding, ties
        0x3F808000,
        0x3F818000,
        0x3F808001,
        0x3F807FFF,  # bf16 ties to even, just above/below
        0x7F7F8000,
        0x7F7F7FFF,  # bf16 rounds up to Inf / stays finite
    ]
    rounding = []
    for hi in range(0, 1 << 16, 7):  # every bf16 value with its tie and neighbours below
        base = hi << 16
        rounding += [base | 0x7FFF, base | 0x8000, base | 0x8001, base | 0x0001]
    for hi in range(0, 1 << 19, 3):  # fp16 rounding: the low 13 bits around the tie
        base = hi << 13
        rounding += [base | 0x0FFF, base | 0x1000, base | 0x1001]
    return np.array(specials + rounding, dtype=np.uint64).astype(np.uint32)


@pytest.mark.parametrize("out", ["bfloat16", "float16"])
@np.errstate(all="ignore")
def test_raw_buffer_cast_is_torchs(out: str) -> None:
    """The converter's cast of raw byte buffers (fp32 -> bf16 on the bits, without ml_dtypes) gives torch's
    bits, NaNs included, for edges, ties and a stride over every fp32 pattern; only the first `n` elements
    of the buffers are touched."""
    for bits in (_edge_fp32(), np.arange(0, 1 << 32, 4093, dtype=np.uint64).astype(np.uint32)):
        n = bits.shape[0]
        src = np.concatenate([bits, np.full(5, 0x3F800000, np.uint32)]).view(np.uint8)
        dst = np.full((n + 5) * 2, 0xAB, np.uint8)
        cast_raw(src, "float32", dst, out, n)
        got, want = dst[: n * 2].view(np.uint16), torch_cast(bits, "float32", out)
        nan = np.isnan(bits.view(np.float32))
        bad = np.flatnonzero((~nan | VECTOR_KERNELS) & (got != want))
        assert not bad.size, [(hex(int(bits[i])), hex(int(got[i])), hex(int(want[i]))) for i in bad[:5]]
        assert np.isnan(got.view(numpy_dtype(out)).astype(np.float32))[nan].all()
        assert (dst[n * 2 :] == 0xAB).all(), "wrote past the n elements asked for"


@pytest.mark.parametrize("out", ["float32", "float16"])
@np.errstate(all="ignore")
def test_raw_buffer_cast_of_bf16_is_torchs(out: str) -> None:
    """bf16 (frozen weights, buffers) to an fp32 or fp16 output on the bits, without ml_dtypes: torch's bits
    for every pattern over more than one block, NaNs included; verify's own integer arithmetic for the same
    casts too; only the first `n` elements of the buffers are touched."""
    from inspector.convert.verify import expected_bytes
    from inspector.format.dtypes import bits_dtype

    bits = np.concatenate([ALL16, ALL16[::7]])  # 65,536 + 9,363: the scratch block and a part of another
    n, size = bits.shape[0], numpy_dtype(out).itemsize
    src = np.concatenate([bits, np.full(5, 0x3F80, np.uint16)]).view(np.uint8)
    dst = np.full((n + 5) * size, 0xAB, np.uint8)
    cast_raw(src, "bfloat16", dst, out, n)
    want = torch_cast(bits, "bfloat16", out)
    nan = np.isnan(bits.view(numpy_dtype("bfloat16")).astype(np.float32))
    for got in (
        dst[: n * size].view(_UINT[size]),
        expected_bytes(bits.view(bits_dtype("bfloat16")), "bfloat16", out).view(_UINT[size]),
    ):
        bad = np.flatnonzero((~nan | VECTOR_KERNELS) & (got != want))
        assert not bad.size, [(hex(int(bits[i])), hex(int(got[i])), hex(int(want[i]))) for i in bad[:5]]
        assert np.isnan(got.view(numpy_dtype(out)))[nan].all()
    assert (dst[n * size :] == 0xAB).all(), "wrote past the n elements asked for"


@pytest.mark.parametrize("out", ["bfloat16", "float16"])
def test_fp32_edges_and_ties(out: str) -> None:
    assert_same(_edge_fp32(), "float32", out)


@pytest.mark.parametrize("out", ["bfloat16", "float16"])
def test_fp32_strided_over_all_patterns(out: str) -> None:
    """Every 251st of the 2^32 fp32 patterns (17 M values spread over all exponents, NaN payloads included)."""
    bits = np.arange(0, 1 << 32, 251, dtype=np.uint64).astype(np.uint32)
    assert_same(bits, "float32", out)


@pytest.mark.parametrize("out", ["bfloat16", "float16"])
@np.errstate(all="ignore")
def test_random_fp32(out: str) -> None:
    rng = np.random.default_rng(7)
    normal = rng.standard_normal(1 << 20, dtype=np.float32) * np.float32(0.02)
    wide = (rng.standard_normal(1 << 20) * 10.0 ** rng.integers(-44, 39, 1 << 20)).astype(np.float32)
    raw = rng.integers(0, 1 << 32, 1 << 20, dtype=np.uint64).astype(np.uint32)
    for bits in (normal.view(np.uint32), wide.view(np.uint32), raw):
        assert_same(bits, "float32", out)


@pytest.mark.parametrize("out", ["float32", "bfloat16", "float16"])
@pytest.mark.parametrize("src", ["float64", "float8_e4m3fn", "float8_e5m2"])
def test_other_float_sources(src: str, out: str) -> None:
    """Wider and narrower sources round through fp32 as torch does (non-NaN values; NaNs stay NaN)."""
    if src == "float64":
        rng = np.random.default_rng(3)
        vals = rng.standard_normal(1 << 18) * 10.0 ** rng.integers(-50, 45, 1 << 18)
        bits = np.concatenate([vals, [0.0, -0.0, np.inf, -np.inf, 65520.0, 65519.99, 1e-45, 3e38]]).view(
            np.uint64
        )
    else:
        bits = np.arange(256, dtype=np.uint8)
    assert_same(bits, src, out, exact_nans=False)


def test_threaded_cast_equals_single_thread() -> None:
    rng = np.random.default_rng(11)
    bits = rng.integers(0, 1 << 32, (1 << 21) + 77, dtype=np.uint64).astype(np.uint32)
    for out in ("bfloat16", "float16"):
        assert np.array_equal(ours(bits, "float32", out, threads=1), ours(bits, "float32", out, threads=3))


@pytest.mark.parametrize("out", ["bfloat16", "float16"])
def test_verify_integer_casts_agree_with_torch(out: str) -> None:
    """verify's own integer-arithmetic casts (its independent check of the converter) against torch."""
    from inspector.convert.verify import bf16_bits, fp16_bits

    ref = bf16_bits if out == "bfloat16" else fp16_bits
    for bits in (_edge_fp32(), np.arange(0, 1 << 32, 251, dtype=np.uint64).astype(np.uint32)):
        want = torch_cast(bits, "float32", out)
        got = ref(bits)
        nan = np.isnan(bits.view(np.float32))
        bad = np.flatnonzero(~nan & (got != want))
        assert not bad.size, [(hex(int(bits[i])), hex(int(got[i])), hex(int(want[i]))) for i in bad[:5]]
        if VECTOR_KERNELS:
            assert np.array_equal(got[nan], want[nan])
