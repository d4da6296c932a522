"""How the pass is spread over workers and what one worker holds: threads from the usable cores (more from a
store), chunks shrunk to keep every worker's buffers in one budget, and the slow float64 comparisons run a
bounded block at a time, so a chunk full of NaN (a diverged run) costs no more memory than a sound one."""

from __future__ import annotations

import math
import tracemalloc
from typing import Any

import ml_dtypes
import numpy as np
import pytest

from inspector.health import stream
from inspector.health.numerics import EXACT_BLOCK, Accumulator, Buffers
from inspector.health.stream import (
    CHUNK_ELEMS,
    MAX_THREADS,
    MIN_CHUNK,
    REMOTE_THREADS,
    SCRATCH_BUDGET,
    SCRATCH_PER_ELEM,
    Scratch,
    Streamer,
    chunk_for,
    default_threads,
)

N = 3 * EXACT_BLOCK + 1234  # several of the slow paths' blocks and a tail


@pytest.mark.parametrize("threads", [1, 2, 3, 4, 5, 8, 12, 16, 64, 1024])
def test_more_workers_never_mean_more_memory(threads: int) -> None:
    chunk = chunk_for(threads)
    assert MIN_CHUNK <= chunk <= CHUNK_ELEMS and chunk & (chunk - 1) == 0
    assert threads * chunk * SCRATCH_PER_ELEM <= SCRATCH_BUDGET or chunk == MIN_CHUNK
    if chunk < CHUNK_ELEMS:  # halved only as far as needed
        assert threads * 2 * chunk * SCRATCH_PER_ELEM > SCRATCH_BUDGET


def test_few_workers_keep_the_cache_sized_chunk() -> None:
    assert chunk_for(2) == chunk_for(4) == CHUNK_ELEMS


def test_threads_follow_the_usable_cores(monkeypatch: pytest.MonkeyPatch) -> None:
    for cores, local, remote in [
        (1, 2, REMOTE_THREADS),
        (6, 6, REMOTE_THREADS),
        (64, MAX_THREADS, MAX_THREADS),
    ]:
        monkeypatch.setattr(stream, "usable_cores", lambda c=cores: c)
        assert (default_threads(), default_threads(remote=True)) == (local, remote), cores


def _reference_diff(master: np.ndarray[Any, Any], module: np.ndarray[Any, Any]) -> tuple[float, int]:
    """Largest |module - bf16(master)| and how many differ, elementwise in float64 (NaN on both sides is no
    difference, on one side an infinite one)."""
    a = module.astype(np.float64)
    b = master.astype(ml_dtypes.bfloat16).astype(np.float64)
    both = np.isnan(a) & np.isnan(b)
    d = np.abs(a - b)
    d[np.isnan(d)] = math.inf
    d[both] = 0.0
    return (float(d.max()), int(np.count_nonzero(d)))


def test_module_copy_compared_block_by_block_with_nan_in_the_master() -> None:
    rng = np.random.default_rng(3)
    master = (0.02 * rng.standard_normal(N)).astype(np.float32)
    master[[7, EXACT_BLOCK + 5, N - 1]] = np.nan  # NaN in several blocks: the NaN-aware cast
    module = master.astype(ml_dtypes.bfloat16)
    module[2 * EXACT_BLOCK + 9] = ml_dtypes.bfloat16(3.0)  # one drifted value, in a block with no NaN
    module[EXACT_BLOCK + 5] = ml_dtypes.bfloat16(1.0)  # a NaN the copy does not hold: infinitely far
    s = Scratch(N)
    got = Streamer._module_diff(master, module, s, finite=False)
    assert got == _reference_diff(master, module) == (math.inf, 2)
    module[EXACT_BLOCK + 5] = ml_dtypes.bfloat16(np.nan)
    assert Streamer._module_diff(master, module, s, finite=False) == _reference_diff(master, module)
    assert _reference_diff(master, module)[1] == 1


def test_a_change_with_nan_and_inf_summed_block_by_block() -> None:
    rng = np.random.default_rng(4)
    then = rng.standard_normal(N).astype(np.float32)
    now = then + np.float32(1e-3) * rng.standard_normal(N).astype(np.float32)
    then[[3, 2 * EXACT_BLOCK]] = now[[3, 2 * EXACT_BLOCK]] = np.nan  # NaN before and after: no change
    now[EXACT_BLOCK + 1] = np.inf  # appeared since: an infinite change
    got = Streamer._delta_sq(now, then, Scratch(N))
    assert got == math.inf
    now[EXACT_BLOCK + 1] = then[EXACT_BLOCK + 1]
    d = now.astype(np.float64) - then.astype(np.float64)
    d[[3, 2 * EXACT_BLOCK]] = 0.0
    assert Streamer._delta_sq(now, then, Scratch(N)) == pytest.approx(float(d @ d), rel=1e-5)


def test_a_chunk_of_nan_allocates_no_more_than_a_block() -> None:
    """The exact path's temporaries (NaN and Inf masks, the finite values' copy) are one EXACT_BLOCK's, not
    one chunk's: a 512 Ki chunk of NaN would otherwise allocate about 5 MiB more per worker."""
    chunk = 1 << 19
    x = np.full(chunk, np.nan, np.float32)
    x[::3] = 1.5
    buf, acc = Buffers(chunk), Accumulator(row=1000)
    acc.add(x[:1000], buf)  # the first call's small allocations out of the way
    tracemalloc.start()
    try:
        acc.add(x, buf)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 6 * EXACT_BLOCK, peak  # a few bytes per element of one block (1.5 MiB before)
    st = acc.result()
    assert st.nan == chunk + 1000 - st.finite and st.minimum == st.maximum == 1.5
