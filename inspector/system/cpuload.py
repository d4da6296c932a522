"""How many of this process's CPUs other work keeps busy now: the contention a run is about to meet.

Measured, not counted: /proc/stat's busy time (user, nice, system, irq, softirq, steal) of the CPUs this
process may run on, over a short window, less this process's own CPU time in it. The number of runnable
tasks (`procs_running`), sampled a few times in 10 ms, counted bursts: on the shared 2-core reference
machine it said 2-4 others while the runs it predicted got 0.87-1.0 of a core each (results.md, 2026-12-03
14:48), so predictions came out up to 2x the runs. The load average trails by a minute."""

from __future__ import annotations

import os
import time
from collections.abc import Callable

WINDOW = 0.1  # seconds watched: /proc/stat counts in 1/100 s ticks, so 10 ticks a CPU
_BUSY = (0, 1, 2, 5, 6, 7)  # user nice system [idle iowait] irq softirq steal
_TOTAL = 8


def _sample(cpus: set[int] | None) -> tuple[int, int, int]:
    """(busy, total) ticks of `cpus` (None: the machine's aggregate line) since boot, and the tasks runnable
    on the machine now, this one included (procs_running): one read of /proc/stat."""
    busy = total = 0
    runnable = -1
    with open("/proc/stat", "rb") as fh:
        for line in fh:
            if line.startswith(b"procs_running"):
                runnable = int(line.split()[1])
                break
            if not line.startswith(b"cpu"):
                continue  # the cpu lines come first, procs_running after them
            name, *fields = line.split()
            if cpus is None and name != b"cpu":
                continue
            if cpus is not None and (name == b"cpu" or int(name[3:]) not in cpus):
                continue
            values = [int(v) for v in fields[:_TOTAL]]
            busy += sum(values[i] for i in _BUSY)
            total += sum(values)
    if runnable < 0:
        raise ValueError("/proc/stat has no procs_running")
    return busy, total, runnable


def others_busy(window: float = WINDOW, meanwhile: Callable[[], object] | None = None) -> float:
    """CPUs' worth of other work on the CPUs we may use, averaged over `window` seconds (0.0 when idle).
    Busy time cannot exceed the CPUs: when they were all busy, the runnable tasks besides us (sampled as
    the window starts and ends) say how many share them, if more. Where /proc/stat cannot be read: the
    one-minute load average less one. `meanwhile`: work of ours to run through the window instead of
    sleeping (preflight's CPU probes, `convert.rates.Pace`)."""
    try:
        cpus: set[int] | None = os.sched_getaffinity(0)
    except (AttributeError, OSError):
        cpus = None
    try:
        b0, t0, first = _sample(cpus)
        own0 = time.process_time()
        if meanwhile is None:
            time.sleep(window)
        else:  # our own CPU time is taken out below, so the window can do our work
            end = time.perf_counter() + window
            while time.perf_counter() < end:
                meanwhile()
        b1, t1, last = _sample(cpus)
        own, queued = time.process_time() - own0, (first + last) / 2 - 1  # less us
    except (OSError, ValueError, IndexError):
        return max(0.0, os.getloadavg()[0] - 1.0)
    n = len(cpus) if cpus else (os.cpu_count() or 1)
    if t1 <= t0:
        return 0.0
    total = min(float(n), (b1 - b0) / (t1 - t0) * n)  # ours included: whether the CPUs were all busy
    busy = max(0.0, total - own / window)
    queued *= n / (os.cpu_count() or n)  # the machine's queue, our CPUs' part of it
    # saturated: the others' busy time is what they got beside us (less when `meanwhile` ran), their number
    # what they would take
    return max(busy, queued) if total >= 0.9 * n else busy
