"""Reading this process's cgroups (v1 and v2, hybrid hosts too): the memory headroom under each level of the
hierarchy and the CPU bandwidth quota. Every file is a kernel pseudo-file that may be missing, unreadable or
garbage; any of those means "no limit from here", never an error."""

from __future__ import annotations

import os
from pathlib import Path

from inspector.system.budget import MemoryLimit
from inspector.system.units import format_bytes

# cgroup v1 reports "no limit" as LONG_MAX rounded down to a page (9223372036854771712); anything this big
# can never be a real limit.
_V1_UNLIMITED = 2**60


def read_text(path: Path) -> str | None:
    """Read a small pseudo-file; any OS error means 'not available here'."""
    try:
        return path.read_text(encoding="utf-8", errors="replace")
    except (OSError, ValueError):
        return None


def read_int(path: Path) -> int | None:
    """A small pseudo-file's one integer; None where it cannot be read or is not one."""
    text = read_text(path)
    if text is None:
        return None
    try:
        return int(text.strip())
    except ValueError:
        return None


def _read_stat_value(path: Path, key: str) -> int | None:
    """Value of ``key`` in a flat 'key value' file such as memory.stat."""
    text = read_text(path)
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


def self_cgroup_paths(proc_root: str) -> tuple[str | None, dict[str, str]]:
    """(v2 path, v1 path of each controller) of this process, from /proc/self/cgroup."""
    text = read_text(Path(proc_root) / "self" / "cgroup")
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


def cgroup_v2_limit(sys_root: str, cgroup_path: str) -> MemoryLimit | None:
    best: MemoryLimit | None = None
    for level in _levels(_v2_root(sys_root), cgroup_path):
        raw = read_text(level / "memory.max")
        if raw is None or raw.strip() == "max":
            continue
        try:
            limit = int(raw.strip())
        except ValueError:
            continue
        charged = read_int(level / "memory.current")
        cache = _read_stat_value(level / "memory.stat", "inactive_file")
        headroom, working, usage = _cgroup_headroom(limit, charged, cache)
        detail = f"cgroup v2 memory.max = {format_bytes(limit)} at {level}, {usage}"
        if best is None or headroom < best.bytes:
            best = MemoryLimit(headroom, "cgroup-v2", detail, limit=limit, in_use=working)
    return best


def cgroup_v1_limit(sys_root: str, cgroup_path: str) -> MemoryLimit | None:
    root = Path(sys_root) / "memory"
    if not root.is_dir():
        return None
    best: MemoryLimit | None = None
    # Hierarchical accounting makes ancestors' limits apply too, so walk up like v2.
    for level in _levels(root, cgroup_path):
        limit = read_int(level / "memory.limit_in_bytes")
        if limit is None or limit <= 0 or limit >= _V1_UNLIMITED:
            continue
        charged = read_int(level / "memory.usage_in_bytes")
        cache = _read_stat_value(level / "memory.stat", "total_inactive_file")
        if cache is None:
            cache = _read_stat_value(level / "memory.stat", "inactive_file")
        headroom, working, usage = _cgroup_headroom(limit, charged, cache)
        detail = f"cgroup v1 memory.limit_in_bytes = {format_bytes(limit)} at {level}, {usage}"
        if best is None or headroom < best.bytes:
            best = MemoryLimit(headroom, "cgroup-v1", detail, limit=limit, in_use=working)
    return best


def cpu_quota(sys_root: str, v2_path: str | None, v1_path: str | None) -> float | None:
    """The tightest CPU bandwidth quota over this cgroup and its ancestors, in cores (v2 `cpu.max`, v1
    `cpu.cfs_quota_us / cpu.cfs_period_us`), or None when there is none."""
    quotas: list[float] = []
    if v2_path is not None:
        for level in _levels(_v2_root(sys_root), v2_path):
            fields = (read_text(level / "cpu.max") or "").split()  # "max 100000" or "150000 100000"
            if len(fields) == 2 and fields[0].isdigit() and fields[1].isdigit() and int(fields[1]) > 0:
                quotas.append(int(fields[0]) / int(fields[1]))
    if v1_path is not None:
        for name in ("cpu", "cpu,cpuacct"):
            for level in _levels(Path(sys_root) / name, v1_path):
                quota, period = read_int(level / "cpu.cfs_quota_us"), read_int(level / "cpu.cfs_period_us")
                if quota is not None and period and quota > 0:
                    quotas.append(quota / period)
    return min(quotas) if quotas else None
