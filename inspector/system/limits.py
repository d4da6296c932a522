"""Memory budget and usable cores of this machine.

Before converting a checkpoint we must know how much memory a *new* process may really use: the OS-wide
``MemAvailable`` is not enough on clusters and in containers, where a cgroup or a Slurm allocation is
usually the binding limit.  This module finds every such limit and picks the tightest one (the records are
`budget`'s, the cgroup files are read by `cgroups`, the output folder's disk is `disk`'s, RSS probes `rss`'s).

It only depends on the standard library and psutil so that the core never pulls in a UI toolkit.
"""

from __future__ import annotations

import functools
import math
import os
import re
import sys
from collections.abc import Mapping
from decimal import Decimal
from pathlib import Path

from inspector.system.budget import LimitSource, MemoryBudget, MemoryLimit
from inspector.system.cgroups import (
    cgroup_v1_limit,
    cgroup_v2_limit,
    cpu_quota,
    read_text,
    self_cgroup_paths,
)
from inspector.system.disk import free_disk_bytes, unwritable
from inspector.system.units import format_bytes

try:  # pragma: no cover - resource is missing only on Windows
    import resource
except ImportError:  # pragma: no cover
    resource = None  # type: ignore[assignment]


# the budget's types and the output folder's checks are defined beside this module and answered here too
__all__ = [
    "LimitSource",
    "MemoryBudget",
    "MemoryLimit",
    "detect_memory_limits",
    "free_disk_bytes",
    "unwritable",
    "usable_cores",
]

# --------------------------------------------------------------------------------------------------------------
# OS
# --------------------------------------------------------------------------------------------------------------


def _read_meminfo(proc_root: str) -> tuple[int, int, str]:
    """(available, total, origin) from /proc/meminfo; psutil only if the file can't be used."""
    text = read_text(Path(proc_root) / "meminfo")
    values: dict[str, int] = {}
    if text is not None:
        for line in text.splitlines():
            key, _, rest = line.partition(":")
            fields = rest.split()
            if not fields:
                continue
            try:
                number = int(fields[0])
            except ValueError:
                continue
            unit = fields[1].lower() if len(fields) > 1 else ""
            values[key.strip()] = number * 1024 if unit == "kb" else number
    if "MemAvailable" in values and "MemTotal" in values:
        return values["MemAvailable"], values["MemTotal"], f"{proc_root}/meminfo"
    import psutil  # the fallback only: importing it costs every command's start-up ~25-50 ms

    vm = psutil.virtual_memory()
    return int(vm.available), int(vm.total), "psutil.virtual_memory()"


def available_memory(proc_root: str = "/proc") -> int:
    """Bytes of memory available now (MemAvailable; psutil's figure where /proc/meminfo cannot be read)."""
    return _read_meminfo(proc_root)[0]


def _os_limit(proc_root: str) -> MemoryLimit:
    available, total, origin = _read_meminfo(proc_root)
    detail = f"MemAvailable = {format_bytes(available)} of MemTotal {format_bytes(total)} ({origin})"
    return MemoryLimit(available, "os-available", detail, limit=total, in_use=max(0, total - available))


# On a tie the more specific source wins: it explains better *why* memory is short.
_TIE_ORDER: dict[str, int] = {
    "cgroup-v2": 0,
    "cgroup-v1": 1,
    "slurm-mem-per-node": 2,
    "slurm-mem-per-cpu": 3,
    "os-available": 4,
}


# --------------------------------------------------------------------------------------------------------------
# Slurm
# --------------------------------------------------------------------------------------------------------------

_SLURM_MEM_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]?)B?\s*$", re.IGNORECASE)
_SLURM_UNITS = {"": 2**20, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}


def _parse_slurm_mem(text: str) -> int | None:
    """Slurm memory values are MiB unless suffixed (K/M/G/T, binary as Slurm uses them)."""
    match = _SLURM_MEM_RE.match(text)
    if not match:
        return None
    return int(Decimal(match.group(1)) * _SLURM_UNITS[match.group(2).upper()])


def _slurm_cpus(environ: Mapping[str, str]) -> tuple[int, str] | None:
    for name in ("SLURM_CPUS_ON_NODE", "SLURM_CPUS_PER_TASK", "SLURM_JOB_CPUS_PER_NODE"):
        value = environ.get(name)
        if not value:
            continue
        match = re.match(r"\s*(\d+)", value)  # "4(x2)" -> 4
        if match and int(match.group(1)) > 0:
            return int(match.group(1)), f"{name}={value}"
    return None


def _slurm_limits(environ: Mapping[str, str]) -> list[MemoryLimit]:
    if not environ.get("SLURM_JOB_ID"):
        return []
    caveat = "job's current usage unknown, full value taken as headroom"
    found: list[MemoryLimit] = []
    per_node = environ.get("SLURM_MEM_PER_NODE")
    if per_node:
        value = _parse_slurm_mem(per_node)
        if value:  # 0 means "all memory of the node": no extra limit
            detail = (
                f"SLURM_MEM_PER_NODE={per_node} -> {format_bytes(value)} for the job on this node ({caveat})"
            )
            found.append(MemoryLimit(value, "slurm-mem-per-node", detail, limit=value))
    per_cpu = environ.get("SLURM_MEM_PER_CPU")
    if per_cpu:
        value = _parse_slurm_mem(per_cpu)
        if value:
            cpus = _slurm_cpus(environ)
            count, origin = cpus if cpus else (1, "CPU count unknown, assuming 1")
            total = value * count
            detail = (
                f"SLURM_MEM_PER_CPU={per_cpu} x {count} CPUs ({origin}) -> {format_bytes(total)} "
                f"for the job on this node ({caveat})"
            )
            found.append(MemoryLimit(total, "slurm-mem-per-cpu", detail, limit=total))
    return found


# --------------------------------------------------------------------------------------------------------------
# RLIMIT_AS
# --------------------------------------------------------------------------------------------------------------


def _rlimit_as(rlimit_as: int | None) -> tuple[int | None, str]:
    """Soft RLIMIT_AS (what a child inherits) or None when unlimited."""
    if rlimit_as is not None:
        soft, origin = rlimit_as, "given"
    elif resource is None:  # pragma: no cover - Windows
        return None, ""
    else:
        soft, hard = resource.getrlimit(resource.RLIMIT_AS)
        origin = "soft limit" if hard == soft else f"soft limit, hard = {_fmt_rlim(hard)}"
    infinity = resource.RLIM_INFINITY if resource is not None else -1
    if soft == infinity or soft < 0:
        return None, origin
    return soft, origin


def _fmt_rlim(value: int) -> str:
    infinity = resource.RLIM_INFINITY if resource is not None else -1
    return "unlimited" if value == infinity or value < 0 else format_bytes(value)


# --------------------------------------------------------------------------------------------------------------
# CPU
# --------------------------------------------------------------------------------------------------------------


def usable_cores(*, proc_root: str = "/proc", sys_root: str = "/sys/fs/cgroup") -> int:
    """Cores this process may really run on: its CPU affinity (which a Slurm or container cpuset sets),
    lowered to a cgroup CPU quota (a container's `--cpus`), at least 1. Thread pools size from this, not
    from the host's core count. This machine's answer is read once (about 0.1 ms of files; casts ask per
    chunk); other roots (tests) every time."""
    if (proc_root, sys_root) == ("/proc", "/sys/fs/cgroup"):
        return _this_machine_cores()
    return _cores(proc_root, sys_root)


REMOTE_THREADS = 6  # from an object store a worker mostly waits on its requests (a master's two or three
# streams fetched together): 6 keep the store's 8 in flight; measured on S3 with health --against, 8 were no
# faster and 11 MiB larger (124 against 113 MiB)


LOCAL_THREADS = 4  # the threads' ceiling on one machine's own files, asked or not. Every pass is Python
# threads whose numpy calls and reads release the GIL for microseconds and take it back: past a few threads
# each handoff waits on another thread's Python and the pass slows down. Measured on a 16-core VM (200M
# demos, page cache warm, 1 / 4 / 16 workers): health's pass 0.82 / 0.28 / 0.88 s (ZeRO-3) and 1.54 / 0.55 /
# 1.49 s (ZeRO-2), convert bf16 0.47 / 0.25 / 0.49 s, universal 1.46 / 0.53 / 0.77 s, while the read floor
# went only 0.08 -> 0.06 s from 4 threads to 16 (memory, not threads, bounds it there). At 8 (2026-12-04,
# tests/benchmarks/device_sweep.sh): health 0.39 against 0.34 s at 4 (ZeRO-3) and 0.58 against 0.45
# (ZeRO-2), bf16 0.30 against 0.24. An interpreter running without the GIL (3.13t and later,
# `gil_enabled`) is not capped (not measured)
ZIP_THREADS = 8  # the universal export's ceiling instead: its workers spend their time in zlib's CRC-32,
# which holds no GIL for a whole MiB, so fewer handoffs. Its pass on the 16-core VM at 4 / 8 workers (200M
# ZeRO-3 demo, warm, five pairs over four calls, 2026-12-04): 0.66 / 0.66, 0.55 / 0.50, 0.76 / 0.53,
# 0.76 / 0.61, 0.76 / 0.69 s; at 6: 0.66 and 0.71; at 16: 0.75-0.96. Health and bf16 were slowest past 4


def workers(asked: int | None = None, remote: bool = False, ceiling: int = LOCAL_THREADS) -> int:
    """The one worker rule for every pass (convert, universal, health): `--workers` asked, else the pass's
    `ceiling` (LOCAL_THREADS; the universal export's ZIP_THREADS). Locally no more than the usable cores
    (`busy_threads`) and, while Python threads take turns at a GIL, no more than the ceiling, asked or not:
    past it every thread only waits on the others' handoffs (on 16 cores, 16 threads took 2.6-3.2 times
    the health pass's time at 4 and 2.3 times bf16's; universal's 1.5 times its time at 8), so a larger
    `--workers` runs as the ceiling, never slower. From an object store as asked (at least REMOTE_THREADS
    by default), each thread waiting on its own requests; without the GIL every usable core."""
    if remote:
        return busy_threads(asked or max(usable_cores(), REMOTE_THREADS), remote)
    most = ceiling if gil_enabled() else usable_cores()
    return busy_threads(min(asked or most, most))


def gil_enabled() -> bool:
    """Whether Python threads take turns here: always before 3.13, and in a free-threaded build unless the
    GIL was turned back on (`PYTHON_GIL=1`, or an extension that needs it)."""
    probe = getattr(sys, "_is_gil_enabled", None)
    return True if probe is None else bool(probe())


def busy_threads(workers: int, remote: bool = False) -> int:
    """Threads that read and work at once for `workers` asked (`--workers`): from an object store all of
    them, each waiting on its own round trip; locally no more than the usable cores, since a thread beyond
    them only reads ahead of a free core, and its chunk leaves the caches before it is worked on (measured on
    2 cores, 200M demo, page cache warm: health 0.41 s at 2 workers, 0.70 s at 16; bf16 0.16 s and 0.21 s).
    Health, convert and universal all size their threads here, and their one buffer budget among them."""
    return max(1, workers if remote else min(workers, usable_cores()))


@functools.cache
def _this_machine_cores() -> int:
    return _cores("/proc", "/sys/fs/cgroup")


def _cores(proc_root: str, sys_root: str) -> int:
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # pragma: no cover - not Linux
        cores = os.cpu_count() or 1
    v2_path, v1_paths = self_cgroup_paths(proc_root)
    quota = cpu_quota(sys_root, v2_path, v1_paths.get("cpu"))
    if quota is not None:
        cores = min(cores, math.ceil(quota))
    return max(1, cores)


# --------------------------------------------------------------------------------------------------------------
# public: detection
# --------------------------------------------------------------------------------------------------------------


def detect_memory_limits(
    *,
    proc_root: str = "/proc",
    sys_root: str = "/sys/fs/cgroup",
    environ: Mapping[str, str] | None = None,
    rlimit_as: int | None = None,
) -> MemoryBudget:
    """Find every memory ceiling that applies to a new process started from here.

    The roots and the environment are parameters so tests can point at fake trees.  ``rlimit_as`` overrides
    ``getrlimit(RLIMIT_AS)``; pass ``resource.RLIM_INFINITY`` for "unlimited".
    """
    env = os.environ if environ is None else environ
    os_limit = _os_limit(proc_root)
    limits: list[MemoryLimit] = [os_limit]

    v2_path, v1_paths = self_cgroup_paths(proc_root)
    v1_path = v1_paths.get("memory")
    if v2_path is not None:
        v2 = cgroup_v2_limit(sys_root, v2_path)
        if v2 is not None:
            limits.append(v2)
    if v1_path is not None:
        v1 = cgroup_v1_limit(sys_root, v1_path)
        if v1 is not None:
            limits.append(v1)
    limits.extend(_slurm_limits(env))

    address_space, origin = _rlimit_as(rlimit_as)
    if address_space is not None:
        detail = (
            f"RLIMIT_AS = {format_bytes(address_space)} ({origin}); caps VIRTUAL size, which for a torch "
            "process is far above RSS, so it is checked against predicted virtual size, not RSS headroom"
        )
        limits.append(MemoryLimit(address_space, "rlimit-as", detail, limit=address_space))

    candidates = [lim for lim in limits if lim.source != "rlimit-as"]
    effective = min(candidates, key=lambda lim: (lim.bytes, _TIE_ORDER.get(lim.source, 99)))
    return MemoryBudget(
        limits=tuple(limits),
        effective=effective,
        address_space_limit=address_space,
        total_ram=os_limit.limit,
    )


def _main() -> None:  # pragma: no cover - manual check: python -m inspector.system.limits
    budget = detect_memory_limits()
    for lim in budget.limits:
        print(f"{lim.source:20} {format_bytes(lim.bytes):>12}  {lim.detail}")
    print(f"effective: {budget.effective.source} {format_bytes(budget.effective.bytes)}")
    print(f"address space limit: {budget.address_space_limit}")
    print(f"free disk at cwd: {format_bytes(free_disk_bytes('.'))}")


if __name__ == "__main__":  # pragma: no cover
    _main()
