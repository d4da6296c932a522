"""Memory and disk budget of this machine, and cheap RSS measurement.

Before converting a checkpoint we must know how much memory a *new* process may really use: the OS-wide
``MemAvailable`` is not enough on clusters and in containers, where a cgroup or a Slurm allocation is
usually the binding limit.  This module finds every such limit, picks the tightest one, (RSS probes live in
`rss`.)

It only depends on the standard library and psutil so that the core never pulls in a UI toolkit.
"""

from __future__ import annotations

import functools
import math
import os
import re
import shutil
from collections.abc import Mapping
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Literal

import psutil

from inspector.system.units import format_bytes

try:  # pragma: no cover - resource is missing only on Windows
    import resource
except ImportError:  # pragma: no cover
    resource = None  # type: ignore[assignment]


__all__ = ["LimitSource", "MemoryBudget", "MemoryLimit", "detect_memory_limits", "free_disk_bytes"]

LimitSource = Literal[
    "os-available", "cgroup-v2", "cgroup-v1", "rlimit-as", "slurm-mem-per-node", "slurm-mem-per-cpu"
]

# cgroup v1 reports "no limit" as LONG_MAX rounded down to a page (9223372036854771712); anything this big
# can never be a real limit.
_V1_UNLIMITED = 2**60

# On a tie the more specific source wins: it explains better *why* memory is short.
_TIE_ORDER: dict[str, int] = {
    "cgroup-v2": 0,
    "cgroup-v1": 1,
    "slurm-mem-per-node": 2,
    "slurm-mem-per-cpu": 3,
    "os-available": 4,
}


@dataclass(frozen=True)
class MemoryLimit:
    """One memory ceiling; ``bytes`` is the headroom a new process gets under it, not the raw limit."""

    bytes: int
    source: LimitSource
    detail: str
    limit: int | None = None  # the configured ceiling (MemTotal for the OS), when known
    in_use: int | None = None  # what is already charged against it, when known


@dataclass(frozen=True)
class MemoryBudget:
    """Every limit found plus the tightest one, which is what the preflight must respect."""

    limits: tuple[MemoryLimit, ...]
    effective: MemoryLimit
    # RLIMIT_AS caps *virtual* size, so it is compared against predicted VSZ, never against RSS headroom.
    address_space_limit: int | None = None
    total_ram: int | None = None


# --------------------------------------------------------------------------------------------------------------
# small file helpers
# --------------------------------------------------------------------------------------------------------------


def _read_text(path: Path) -> str | None:
    """Read a small pseudo-file; any OS error means 'not available here'."""
    try:
        return path.read_text(encoding="utf-8", errors="replace")
    except (OSError, ValueError):
        return None


def _read_int(path: Path) -> int | None:
    text = _read_text(path)
    if text is None:
        return None
    try:
        return int(text.strip())
    except ValueError:
        return None


def _read_stat_value(path: Path, key: str) -> int | None:
    """Value of ``key`` in a flat 'key value' file such as memory.stat."""
    text = _read_text(path)
    if text is None:
        return None
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0] == key:
            try:
                return int(parts[1])
            except ValueError:
                return None
    return None


# --------------------------------------------------------------------------------------------------------------
# OS
# --------------------------------------------------------------------------------------------------------------


def _read_meminfo(proc_root: str) -> tuple[int, int, str]:
    """(available, total, origin) from /proc/meminfo; psutil only if the file can't be used."""
    text = _read_text(Path(proc_root) / "meminfo")
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
    vm = psutil.virtual_memory()
    return int(vm.available), int(vm.total), "psutil.virtual_memory()"


def _os_limit(proc_root: str) -> MemoryLimit:
    available, total, origin = _read_meminfo(proc_root)
    detail = f"MemAvailable = {format_bytes(available)} of MemTotal {format_bytes(total)} ({origin})"
    return MemoryLimit(available, "os-available", detail, limit=total, in_use=max(0, total - available))


# --------------------------------------------------------------------------------------------------------------
# cgroups
# --------------------------------------------------------------------------------------------------------------


def _self_cgroup_paths(proc_root: str) -> tuple[str | None, dict[str, str]]:
    """(v2 path, v1 path of each controller) of this process, from /proc/self/cgroup."""
    text = _read_text(Path(proc_root) / "self" / "cgroup")
    v2: str | None = None
    v1: dict[str, str] = {}
    for line in (text or "").splitlines():
        parts = line.strip().split(":", 2)
        if len(parts) != 3:
            continue
        hier_id, controllers, path = parts
        path = path.removesuffix(" (deleted)")
        if hier_id == "0" and controllers == "":
            v2 = path
        else:
            v1.update(dict.fromkeys(controllers.split(","), path))
    return v2, v1


def _v2_root(sys_root: str) -> Path:
    """Where the v2 hierarchy is mounted: `sys_root`, or on hybrid hosts <sys_root>/unified next to the v1
    controllers."""
    root = Path(sys_root)
    if not (root / "cgroup.controllers").exists() and (root / "unified").is_dir():
        return root / "unified"
    return root


def _levels(root: Path, cgroup_path: str) -> list[Path]:
    """Directories from this cgroup up to the hierarchy root, leaf first.

    Levels that don't exist are kept and simply yield no files: inside a container the path from
    /proc/self/cgroup is often not visible because the container's own cgroup is mounted as the root, and
    the walk then ends at that root, which is the right place to look.
    """
    rel = os.path.normpath("/" + cgroup_path.strip()).lstrip("/")  # normpath drops any ".."
    leaf = root / rel if rel and rel != "." else root
    levels = [leaf]
    current = leaf
    while current != root and current.parent != current:
        current = current.parent
        levels.append(current)
    return levels


def _cgroup_headroom(limit: int, charged: int | None, cache: int | None) -> tuple[int, int | None, str]:
    """Headroom under one cgroup level, not counting reclaimable inactive page cache as used.

    The kernel charges page cache to the cgroup; after reading a big checkpoint ``current`` sits near the
    limit even though that cache is dropped on demand, so counting it would predict false OOMs.
    """
    if charged is None:
        return limit, None, "usage unknown"
    working = max(0, charged - (cache or 0))
    usage = f"{format_bytes(working)} in use"
    if cache:
        usage += f" ({format_bytes(charged)} charged incl. {format_bytes(cache)} reclaimable inactive cache)"
    return max(0, limit - working), working, usage


def _cgroup_v2_limit(sys_root: str, cgroup_path: str) -> MemoryLimit | None:
    best: MemoryLimit | None = None
    for level in _levels(_v2_root(sys_root), cgroup_path):
        raw = _read_text(level / "memory.max")
        if raw is None or raw.strip() == "max":
            continue
        try:
            limit = int(raw.strip())
        except ValueError:
            continue
        charged = _read_int(level / "memory.current")
        cache = _read_stat_value(level / "memory.stat", "inactive_file")
        headroom, working, usage = _cgroup_headroom(limit, charged, cache)
        detail = f"cgroup v2 memory.max = {format_bytes(limit)} at {level}, {usage}"
        if best is None or headroom < best.bytes:
            best = MemoryLimit(headroom, "cgroup-v2", detail, limit=limit, in_use=working)
    return best


def _cgroup_v1_limit(sys_root: str, cgroup_path: str) -> MemoryLimit | None:
    root = Path(sys_root) / "memory"
    if not root.is_dir():
        return None
    best: MemoryLimit | None = None
    # Hierarchical accounting makes ancestors' limits apply too, so walk up like v2.
    for level in _levels(root, cgroup_path):
        limit = _read_int(level / "memory.limit_in_bytes")
        if limit is None or limit <= 0 or limit >= _V1_UNLIMITED:
            continue
        charged = _read_int(level / "memory.usage_in_bytes")
        cache = _read_stat_value(level / "memory.stat", "total_inactive_file")
        if cache is None:
            cache = _read_stat_value(level / "memory.stat", "inactive_file")
        headroom, working, usage = _cgroup_headroom(limit, charged, cache)
        detail = f"cgroup v1 memory.limit_in_bytes = {format_bytes(limit)} at {level}, {usage}"
        if best is None or headroom < best.bytes:
            best = MemoryLimit(headroom, "cgroup-v1", detail, limit=limit, in_use=working)
    return best


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


def _cpu_quota(sys_root: str, v2_path: str | None, v1_path: str | None) -> float | None:
    """The tightest CPU bandwidth quota over this cgroup and its ancestors, in cores (v2 `cpu.max`, v1
    `cpu.cfs_quota_us / cpu.cfs_period_us`), or None when there is none."""
    quotas: list[float] = []
    if v2_path is not None:
        for level in _levels(_v2_root(sys_root), v2_path):
            fields = (_read_text(level / "cpu.max") or "").split()  # "max 100000" or "150000 100000"
            if len(fields) == 2 and fields[0].isdigit() and fields[1].isdigit() and int(fields[1]) > 0:
                quotas.append(int(fields[0]) / int(fields[1]))
    if v1_path is not None:
        for name in ("cpu", "cpu,cpuacct"):
            for level in _levels(Path(sys_root) / name, v1_path):
                quota, period = _read_int(level / "cpu.cfs_quota_us"), _read_int(level / "cpu.cfs_period_us")
                if quota is not None and period and quota > 0:
                    quotas.append(quota / period)
    return min(quotas) if quotas else None


def usable_cores(*, proc_root: str = "/proc", sys_root: str = "/sys/fs/cgroup") -> int:
    """Cores this process may really run on: its CPU affinity (which a Slurm or container cpuset sets),
    lowered to a cgroup CPU quota (a container's `--cpus`), at least 1. Thread pools size from this, not
    from the host's core count. This machine's answer is read once (about 0.1 ms of files; casts ask per
    chunk); other roots (tests) every time."""
    if (proc_root, sys_root) == ("/proc", "/sys/fs/cgroup"):
        return _this_machine_cores()
    return _cores(proc_root, sys_root)


@functools.cache
def _this_machine_cores() -> int:
    return _cores("/proc", "/sys/fs/cgroup")


def _cores(proc_root: str, sys_root: str) -> int:
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # pragma: no cover - not Linux
        cores = os.cpu_count() or 1
    v2_path, v1_paths = _self_cgroup_paths(proc_root)
    quota = _cpu_quota(sys_root, v2_path, v1_paths.get("cpu"))
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

    v2_path, v1_paths = _self_cgroup_paths(proc_root)
    v1_path = v1_paths.get("memory")
    if v2_path is not None:
        v2 = _cgroup_v2_limit(sys_root, v2_path)
        if v2 is not None:
            limits.append(v2)
    if v1_path is not None:
        v1 = _cgroup_v1_limit(sys_root, v1_path)
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


def _existing(path: str | os.PathLike[str]) -> Path:
    current = Path(os.path.abspath(os.fspath(path)))
    while not current.exists() and current.parent != current:
        current = current.parent
    return current


def unwritable(path: str | os.PathLike[str]) -> str:
    """Why an output cannot be created at `path` ("" when it can): a read-only file system, or a folder
    this user may not write to. Asks the kernel (statvfs, access); creates nothing."""
    where = _existing(path)
    try:
        if os.statvfs(where).f_flag & os.ST_RDONLY:
            return f"{where} is on a read-only file system"
    except OSError:
        return f"{where} cannot be examined"
    folder = where if where.is_dir() else where.parent
    if not os.access(folder, os.W_OK | os.X_OK):
        return f"{folder} is not writable by this user"
    return ""


def free_disk_bytes(path: str | os.PathLike[str]) -> int:
    """Free space (for unprivileged users) where ``path`` will be created.

    The output folder usually does not exist yet, so the nearest existing ancestor decides the filesystem.
    """
    current = Path(os.path.abspath(os.fspath(path)))
    while not current.exists() and current.parent != current:
        current = current.parent
    return shutil.disk_usage(current).free  # f_bavail * f_frsize


def _main() -> None:
    from inspector.system.units import format_bytes
  # pragma: no cover - manual check: python -m inspector.system.limits
    budget = detect_memory_limits()
    for lim in budget.limits:
        print(f"{lim.source:20} {format_bytes(lim.bytes):>12}  {lim.detail}")
    print(f"effective: {budget.effective.source} {format_bytes(budget.effective.bytes)}")
    print(f"address space limit: {budget.address_space_limit}")
    print(f"free disk at cwd: {format_bytes(free_disk_bytes('.'))}")


if __name__ == "__main__":  # pragma: no cover
    _main()

