"""The chunk health's workers reduce in: of two sizes, the one this machine's caches run faster, timed.

A worker reads a chunk of each stream and makes a handful of passes over it (`numerics`): they find the
chunk in a cache only if it fits one that is fast. Which one that is differs by machine, and cache sizes
do not tell it:

* a 2-core AMD EPYC VM (1 MiB of L2 a core, 32 MiB of L3): 4 MiB chunks were fastest, the L3 serving the
  passes at 50-80 GB/s (1 MiB chunks only added calls: 38-54 ms against 37 ms over 256 MiB);
* a 2-core Xeon VM (2 MiB of L2 a core; an L3 no faster than memory, 29 GB/s): 1 MiB chunks ran the
  passes twice as fast on one thread (health at 1 worker 0.63 s against 0.82 s on the 200M ZeRO-3 demo),
  but two threads side by side ran them slower at 1 MiB than at 4 (health at 2 workers 0.65 s against
  0.45 s): its two vCPUs behave as if they shared one core's L2.

So where the pass runs one worker, both sizes are timed before it (if it is big enough to pay), doing the
pass's own work (a copy in, as a read lands, then min, max and Σx²: `rates.reduce_passes`) through more
memory than a core's L2 holds, and the smaller one is kept only where it is clearly faster. Several
workers keep the plan's chunk: side by side they were never faster at 1 MiB where measured, and a probe
on several threads short enough to pay (4 MiB a thread) chose 1 MiB on two threads in 2 of 6 runs here,
each then 50 % slower (1.10 s against 0.73 s). Both sizes are multiples of GROUP, so the figures are the
same bits whichever is chosen. The answer is kept for the process, with how much faster the chosen size ran:
health's preflight asks the same question and prices the pass's numpy work at that speed (its reduction probe
times the plan's chunk), where it read +28 % on the 200M ZeRO-2 demo at one worker.
"""

from __future__ import annotations

import functools
import time
from typing import NamedTuple

import numpy as np

from inspector.convert.rates import reduce_passes
from inspector.health.numerics import GROUP

SMALL = GROUP  # 1 MiB of fp32: the smaller candidate (the larger: the plan's chunk)
SPAN = 1 << 20  # elements each probe thread streams through a trial (4 MiB of fp32: past a core's L2)
TRIALS = 3  # each size's best of this many
MARGIN = 0.8  # the smaller chunk is kept where it takes at most this share of the larger one's time
WORTH = 256 << 20  # bytes a pass must read for the probe (7-18 ms) to pay


class Choice(NamedTuple):
    chunk: int  # elements a worker reduces at a time
    speedup: float  # the plan's chunk's time over the chosen one's (1.0 where the plan's is kept)


@functools.cache
def chunk_choice(threads: int, chunk: int) -> Choice:
    """`chunk` (the plan's), or SMALL where one thread runs the pass's work clearly faster in SMALL chunks
    here; `threads` above one keep `chunk` (see the module docstring)."""
    if threads != 1 or chunk <= SMALL:
        return Choice(chunk, 1.0)
    small, large = (_seconds(c) for c in (SMALL, chunk))
    return Choice(SMALL, large / small) if small <= MARGIN * large else Choice(chunk, 1.0)


def pass_chunk(threads: int, chunk: int, nbytes: int) -> Choice:
    """The chunk a local pass reading `nbytes` on `threads` workers runs in: the probe only where the pass
    is big enough to pay for it (WORTH). The pass and its preflight both ask here, so they agree."""
    return chunk_choice(threads, chunk) if nbytes >= WORTH else Choice(chunk, 1.0)


def _seconds(chunk: int) -> float:
    """The best of TRIALS times of streaming SPAN elements through `chunk`-sized pieces: each copied in,
    then reduced."""
    src, dst = np.ones(SPAN, np.float32), np.empty(chunk, np.float32)
    best = float("inf")
    for _ in range(TRIALS):
        t = time.perf_counter()
        for i in range(0, SPAN, chunk):
            part = dst[: min(chunk, SPAN - i)]
            np.copyto(part, src[i : i + part.shape[0]])
            reduce_passes(part)
        best = min(best, time.perf_counter() - t)
    return best
