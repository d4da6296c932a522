"""One BLAS thread: the tool runs its own workers, and OpenBLAS's pool only spins beside them.

numpy's OpenBLAS starts a thread per core when it loads, and each spins on its queue (~0.1 s of a core)
before it sleeps, again after any call that woke it. Nothing here wants BLAS threads: health's inner
products are 256 elements a call (below every threading threshold), the merged kind's B·A is summed in a
fixed order without BLAS, and every parallel pass runs on the tool's own threads. Measured on this 2-core
machine: `import numpy` then a second's sleep cost 0.21 CPU-s with the pool and 0.08 without; health of
the 200M ZeRO-3 demo at 2 workers 0.65-0.68 → 0.50-0.57 user CPU-s, the same answers. On a 16-core
machine the pool is 15 spinning threads contending with the tool's. The setting must be in the
environment before numpy loads its BLAS; a user's own choice (OPENBLAS_NUM_THREADS, OMP_NUM_THREADS,
which OpenBLAS also reads) wins, and Ray workers have OMP_NUM_THREADS set by Ray itself.
"""

from __future__ import annotations

import os
import sys

SETTINGS = ("OPENBLAS_NUM_THREADS", "GOTO_NUM_THREADS", "OMP_NUM_THREADS")


def one_blas_thread() -> bool:
    """Ask OpenBLAS for one thread, for this process and its children; True when it applied (numpy not yet
    loaded, no setting of the user's)."""
    if "numpy" in sys.modules or any(k in os.environ for k in SETTINGS):
        return False
    os.environ["OPENBLAS_NUM_THREADS"] = "1"
    return True
