"""The reductions against torch in float64 on data chosen to reach each path: plain float32 blocks, a shift
for values clustered far from zero, the exact float64 path for NaN/Inf, overflowing squares and values a few
ulps apart, bf16 widened; each within the bound numerics.py states, whatever the chunk cuts."""

from __future__ import annotations

import math
from typing import Any

import ml_dtypes
import numpy as np
import pytest

from inspector.health import numerics
from inspector.health.numerics import BLOCK, STD_REL, Accumulator, Buffers, block_sums
from inspector.health.stats import Stats
from tests.health.helpers import assert_matches, torch_stats

RNG = np.random.default_rng(7)
N = 3 * (1 << 16) + 123  # several chunks and a tail that is not a whole block


def _data() -> dict[str, np.ndarray[Any, Any]]:
    ones = 1.0 + 1e-4 * RNG.standard_normal(N)
    spaced = np.float32(1.0) + np.arange(N) % 3 * np.finfo(np.float32).eps  # three values, an ulp apart
    nonfinite = RNG.standard_normal(N).astype(np.float32)
    nonfinite[[5, 70000, N - 1]] = [np.nan, np.inf, -np.inf]
    return {
        "weights": (0.02 * RNG.standard_normal(N)).astype(np.float32),
        "layernorm": ones.astype(np.float32),  # mean² ≫ var: shifted
        "offset": (1e4 + RNG.standard_normal(N)).astype(np.float32),  # mean far outside the spread
        "exp_avg_sq": (1e-3 * RNG.standard_normal(N)).astype(np.float32) ** 2,
        # mean² = var: exponential values (std equal to the mean), taken unshifted
        "exponential": (1e-6 * RNG.standard_exponential(N)).astype(np.float32),
        "just_shifted": (1.0 + RNG.standard_exponential(N)).astype(np.float32),  # mean² = 4·var: shifted
        "constant": np.full(N, 0.5, np.float32),
        "spaced": spaced.astype(np.float32),
        "huge": (1e25 * RNG.standard_normal(N)).astype(np.float32),  # squares overflow float32
        "nonfinite": nonfinite,
        "bf16": (0.02 * RNG.standard_normal(N)).astype(ml_dtypes.bfloat16),
        "fp16_ones": (1.0 + 1e-2 * RNG.standard_normal(N)).astype(np.float16),
        "int64": RNG.integers(-(2**40), 2**40, N),
    }


DATA = _data()


def _stream(x: np.ndarray[Any, Any], chunk: int) -> Stats:
    acc, buf = Accumulator(), Buffers(chunk)
    for i in range(0, x.shape[0], chunk):
        acc.add(x[i : i + chunk], buf)
    return acc.result()


@pytest.mark.parametrize("chunk", [1000, 4099, 1 << 16, 1 << 18])
@pytest.mark.parametrize("name", list(DATA))
def test_each_path_within_the_stated_bound(name: str, chunk: int) -> None:
    x = DATA[name]
    assert_matches(_stream(x, chunk), torch_stats(x), f"{name}/{chunk}")


@pytest.mark.parametrize("name", ["huge", "int64", "constant"])
def test_exact_cases_are_float64_exact(name: str) -> None:
    """The float64 path (overflow, integers) and a constant tensor (shifted to zero) carry no float32 error."""
    st, ref = _stream(DATA[name], 1 << 16), torch_stats(DATA[name])
    assert st.std == pytest.approx(ref["std"], rel=1e-12, abs=1e-300)
    assert st.norm == pytest.approx(ref["norm"], rel=1e-12)
    assert st.mean == pytest.approx(ref["mean"], rel=1e-12)


def test_the_shift_is_what_keeps_the_std() -> None:
    """Without the shift, values 1 ± 1e-4 would lose the std to the float32 sums' cancellation (the bound
    relative to mean² is 1e-5 · 1e8); with it the std is within its bound."""
    x = DATA["layernorm"]
    st = _stream(x, 1 << 16)
    ref = torch_stats(x)
    assert abs(st.std / ref["std"] - 1) < STD_REL
    acc, buf = Accumulator(), Buffers(1 << 16)
    acc.add(x[: 1 << 16], buf)
    assert acc.k != 0.0  # the shift was taken


def test_no_shift_while_the_spread_is_the_means_size() -> None:
    """Values whose std is about their mean (exponential, like `exp_avg_sq`) skip the shift's extra passes;
    values whose mean is 2 stds away take it."""
    buf = Buffers(1 << 16)
    plain, shifted = Accumulator(), Accumulator()
    plain.add(DATA["exponential"][: 1 << 16], buf)
    shifted.add(DATA["just_shifted"][: 1 << 16], buf)
    assert plain.k == 0.0
    assert shifted.k != 0.0


def test_block_sums_tail_and_overflow() -> None:
    buf = Buffers(4 * BLOCK)
    v = np.arange(1, 2 * BLOCK + 8, dtype=np.float32)
    s1, s2 = block_sums(v, buf)
    n = v.shape[0]
    assert (s1, s2) == (n * (n + 1) / 2, n * (n + 1) * (2 * n + 1) / 6)  # small integers: exact
    assert not math.isfinite(block_sums(np.full(BLOCK, 1e20, np.float32), buf)[1])


@pytest.mark.skipif(not hasattr(np, "vecdot"), reason="numpy 1.x has only the matmul form")
def test_both_row_dot_forms_give_the_same_bits(monkeypatch: pytest.MonkeyPatch) -> None:
    """numpy 2's vecdot and numpy 1's batched matmul: the same figures whichever numpy a user has (each row
    checked against a float64 sum too, within the block bound)."""
    rng = np.random.default_rng(7)
    x = (rng.standard_normal(64 * BLOCK) * rng.lognormal(0, 3, 64 * BLOCK)).astype(np.float32)
    rows = x.reshape(-1, BLOCK)
    a, b = np.empty(64, np.float32), np.empty(64, np.float32)
    numerics._vecdot_rows(rows, a)
    numerics._matmul_rows(rows, b)
    assert a.tobytes() == b.tobytes()
    exact = np.einsum("ij,ij->i", rows.astype(np.float64), rows.astype(np.float64))
    assert np.all(np.abs(a - exact) <= numerics.GAMMA * exact)
    whole = []
    for form in (numerics._vecdot_rows, numerics._matmul_rows):
        monkeypatch.setattr(numerics, "row_dots", form)
        acc = Accumulator()
        acc.add(x, Buffers(x.shape[0]))
        whole.append(acc.result())
    assert whole[0] == whole[1]
