"""How many bytes a run may write before the kernel makes it wait for the disk.

Written bytes land in the page cache as dirty pages; the kernel lets a writer run free until the dirty pages
pass the midpoint of its background and hard limits (`dirty_freerun_ceiling` in mm/page-writeback.c), then
paces it to what the disk writes back. A conversion's output beyond that point therefore goes at the disk's
pace, whatever the cores: on the 2-core reference machine universal's 6 GB from a 500M demo took 3.2-3.7 s at
2-16 workers, its 2.4 GB from a 200M demo 0.75-0.90 s. Preflight's time model (`convert/calibrate.py`) takes
the point from here. The ratios apply to memory available now (MemAvailable, as the kernel's dirtyable
memory roughly is); a cgroup v2 memory limit gives a cgroup a smaller point of its own, not read here.
"""

from __future__ import annotations

import math
from pathlib import Path

from inspector.system.cgroups import read_int
from inspector.system.limits import available_memory


def freerun_bytes(proc_root: str = "/proc", dirtyable: int | None = None) -> float:
    """Dirty bytes below which a writer is never throttled: the midpoint of `vm.dirty_background_*` and
    `vm.dirty_*` (bytes where set, else that ratio of `dirtyable`: memory available now by default). Infinite
    where /proc/sys/vm cannot be read (no term for it in the model then)."""
    vm = Path(proc_root) / "sys" / "vm"
    memory = available_memory(proc_root) if dirtyable is None else dirtyable
    limits = []
    for name in ("dirty_background", "dirty"):
        nbytes, ratio = read_int(vm / f"{name}_bytes"), read_int(vm / f"{name}_ratio")
        if nbytes:
            limits.append(float(nbytes))
        elif ratio is not None:
            limits.append(memory * ratio / 100.0)
        else:
            return math.inf
    return (limits[0] + limits[1]) / 2.0
