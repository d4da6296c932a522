"""Tests for inspector.system.limits: memory limits on fake /proc and cgroup trees, usable cores, free disk."""

from __future__ import annotations

import os
import resource
from pathlib import Path

import pytest

from inspector.system.limits import (
    MemoryBudget,
    MemoryLimit,
    detect_memory_limits,
    free_disk_bytes,
    usable_cores,
)

GiB = 2**30
MiB = 2**20
KiB = 2**10
V1_UNLIMITED = 9223372036854771712  # LONG_MAX rounded down to a page, as the kernel reports it


# --------------------------------------------------------------------------------------------------------------
# fake trees
# --------------------------------------------------------------------------------------------------------------


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def make_proc(tmp_path: Path, cgroup: str | None, total: int = 64 * GiB, available: int = 48 * GiB) -> Path:
    proc = tmp_path / "proc"
    _write(
        proc / "meminfo",
        f"MemTotal:       {total // KiB} kB\nMemFree:        1000 kB\nMemAvailable:   {available // KiB} kB\n",
    )
    if cgroup is not None:
        _write(proc / "self" / "cgroup", cgroup)
    return proc


def detect(proc: Path, sys_root: Path, environ: dict[str, str] | None = None, **kw: int) -> MemoryBudget:
    return detect_memory_limits(
        proc_root=str(proc),
        sys_root=str(sys_root),
        environ=environ or {},
        rlimit_as=kw.get("rlimit_as", resource.RLIM_INFINITY),
    )


def by_source(budget: MemoryBudget, source: str) -> MemoryLimit:
    found = [lim for lim in budget.limits if lim.source == source]
    assert len(found) == 1, budget.limits
    return found[0]


def sources(budget: MemoryBudget) -> set[str]:
    return {lim.source for lim in budget.limits}


# --------------------------------------------------------------------------------------------------------------
# OS
# --------------------------------------------------------------------------------------------------------------


def test_os_available_from_meminfo(tmp_path: Path) -> None:
    proc = make_proc(tmp_path, None, total=32 * GiB, available=20 * GiB)
    budget = detect(proc, tmp_path / "nocgroup")
    assert sources(budget) == {"os-available"}
    assert budget.effective.source == "os-available"
    assert budget.effective.bytes == 20 * GiB
    assert budget.total_ram == 32 * GiB
    assert budget.effective.in_use == 12 * GiB
    assert "20.0 GiB" in budget.effective.detail and "32.0 GiB" in budget.effective.detail


def test_unreadable_meminfo_falls_back_to_psutil(tmp_path: Path) -> None:
    import psutil

    budget = detect(tmp_path / "empty-proc", tmp_path / "nocgroup")
    assert budget.total_ram == psutil.virtual_memory().total
    assert "psutil" in budget.effective.detail


# --------------------------------------------------------------------------------------------------------------
# cgroup v2
# --------------------------------------------------------------------------------------------------------------


def make_v2(sys_root: Path, levels: dict[str, tuple[str, int | None]]) -> None:
    """levels: relative path -> (memory.max text, memory.current or None)."""
    _write(sys_root / "cgroup.controllers", "cpu memory pids\n")
    for rel, (max_text, current) in levels.items():
        d = sys_root / rel
        d.mkdir(parents=True, exist_ok=True)
        (d / "memory.max").write_text(max_text + "\n")
        if current is not None:
            (d / "memory.current").write_text(f"{current}\n")


def test_cgroup_v2_parent_tighter_than_leaf(tmp_path: Path) -> None:
    proc = make_proc(tmp_path, "0::/user.slice/job.scope\n")
    cg = tmp_path / "cg"
    make_v2(
        cg,
        {
            "user.slice": (str(8 * GiB), 6 * GiB),  # 2 GiB headroom: the binding level
            "user.slice/job.scope": (str(16 * GiB), 1 * GiB),  # 15 GiB headroom
        },
    )
    budget = detect(proc, cg)
    v2 = by_source(budget, "cgroup-v2")
    assert v2.bytes == 2 * GiB
    assert v2.limit == 8 * GiB and v2.in_use == 6 * GiB
    assert str(cg / "user.slice") in v2.detail and "job.scope" not in v2.detail
    assert "memory.max = 8.0 GiB" in v2.detail and "6.0 GiB in use" in v2.detail
    assert budget.effective == v2


def test_cgroup_v2_leaf_limit_only(tmp_path: Path) -> None:
    proc = make_proc(tmp_path, "0::/a/b\n")
    cg = tmp_path / "cg"
    make_v2(cg, {"a": ("max", 3 * GiB), "a/b": (str(4 * GiB), 1 * GiB)})
    budget = detect(proc, cg)
    assert budget.effective.source == "cgroup-v2"
    assert budget.effective.bytes == 3 * GiB


def test_cgroup_v2_max_everywhere_means_no_limit(tmp_path: Path) -> None:
    proc = make_proc(tmp_path, "0::/a/b\n")
    cg = tmp_path / "cg"
    make_v2(cg, {"a": ("max", 5 * GiB), "a/b": ("max", 1 * GiB)})
    budget = detect(proc, cg)
    assert sources(budget) == {"os-available"}
    assert budget.effective.source == "os-available"


def test_cgroup_v2_inactive_file_cache_is_not_counted_as_used(tmp_path: Path) -> None:
    proc = make_proc(tmp_path, "0::/job\n")
    cg = tmp_path / "cg"
    make_v2(cg, {"job": (str(8 * GiB), 7 * GiB)})
    _write(cg / "job" / "memory.stat", f"anon {2 * GiB}\nfile {5 * GiB}\ninactive_file {4 * GiB}\n")
    v2 = by_source(detect(proc, cg), "cgroup-v2")
    assert v2.bytes == 5 * GiB  # 8 - (7 - 4)
    assert v2.in_use == 3 * GiB
    assert "reclaimable" in v2.detail


def test_cgroup_v2_over_limit_clamps_to_zero(tmp_path: Path) -> None:
    proc = make_proc(tmp_path, "0::/job\n")
    cg = tmp_path / "cg"
    make_v2(cg, {"job": (str(1 * GiB), 2 * GiB)})
    assert by_source(detect(proc, cg), "cgroup-v2").bytes == 0


def test_cgroup_v2_missing_current_uses_full_limit(tmp_path: Path) -> None:
    proc = make_proc(tmp_path, "0::/job\n")
    cg = tmp_path / "cg"
    make_v2(cg, {"job": (str(4 * GiB), None)})
    v2 = by_source(detect(proc, cg), "cgroup-v2")
    assert v2.bytes == 4 * GiB and v2.in_use is None
    assert "unknown" in v2.detail


def test_cgroup_v2_path_not_visible_uses_root(tmp_path: Path) -> None:
    """Inside a container the cgroup namespace root is the container's own cgroup."""
    proc = make_proc(tmp_path, "0::/kubepods/pod1/ctr\n")
    cg = tmp_path / "cg"
    make_v2(cg, {".": (str(6 * GiB), 2 * GiB)})
    assert by_source(detect(proc, cg), "cgroup-v2").bytes == 4 * GiB


def test_cgroup_v2_hybrid_layout_under_unified(tmp_path: Path) -> None:
    proc = make_proc(tmp_path, "4:memory:/\n0::/svc\n")
    cg = tmp_path / "cg"
    (cg / "memory").mkdir(parents=True)
    make_v2(cg / "unified", {"svc": (str(3 * GiB), 1 * GiB)})
    assert by_source(detect(proc, cg), "cgroup-v2").bytes == 2 * GiB


def test_garbage_cgroup_files_are_ignored(tmp_path: Path) -> None:
    proc = make_proc(tmp_path, "garbage line\n0::/job\n")
    cg = tmp_path / "cg"
    make_v2(cg, {"job": ("not-a-number", 1 * GiB)})
    assert sources(detect(proc, cg)) == {"os-available"}


# --------------------------------------------------------------------------------------------------------------
# cgroup v1
# --------------------------------------------------------------------------------------------------------------


def make_v1(sys_root: Path, rel: str, limit: int, usage: int | None) -> Path:
    d = sys_root / "memory" / rel
    d.mkdir(parents=True, exist_ok=True)
    (d / "memory.limit_in_bytes").write_text(f"{limit}\n")
    if usage is not None:
        (d / "memory.usage_in_bytes").write_text(f"{usage}\n")
    return d


V1_CGROUP = "9:cpu,cpuacct:/\n4:memory:/slurm/uid_1/job_7\n1:name=systemd:/\n"


def test_cgroup_v1_huge_number_means_unlimited(tmp_path: Path) -> None:
    proc = make_proc(tmp_path, V1_CGROUP)
    cg = tmp_path / "cg"
    make_v1(cg, ".", V1_UNLIMITED, 10 * GiB)
    make_v1(cg, "slurm/uid_1/job_7", V1_UNLIMITED, 1 * GiB)
    make_v1(cg, "slurm", 2**62, 1 * GiB)
    assert sources(detect(proc, cg)) == {"os-available"}


def test_cgroup_v1_real_limit(tmp_path: Path) -> None:
    proc = make_proc(tmp_path, V1_CGROUP)
    cg = tmp_path / "cg"
    make_v1(cg, ".", V1_UNLIMITED, 10 * GiB)
    leaf = make_v1(cg, "slurm/uid_1/job_7", 12 * GiB, 5 * GiB)
    budget = detect(proc, cg)
    v1 = by_source(budget, "cgroup-v1")
    assert v1.bytes == 7 * GiB and v1.limit == 12 * GiB
    assert str(leaf) in v1.detail and "memory.limit_in_bytes = 12.0 GiB" in v1.detail
    assert budget.effective == v1


def test_cgroup_v1_ancestor_limit_applies(tmp_path: Path) -> None:
    proc = make_proc(tmp_path, V1_CGROUP)
    cg = tmp_path / "cg"
    make_v1(cg, "slurm/uid_1/job_7", 12 * GiB, 5 * GiB)
    make_v1(cg, "slurm/uid_1", 10 * GiB, 9 * GiB)
    assert by_source(detect(proc, cg), "cgroup-v1").bytes == 1 * GiB


def test_cgroup_v1_container_path_missing_uses_mount_root(tmp_path: Path) -> None:
    proc = make_proc(tmp_path, "4:memory:/docker/abcdef\n")
    cg = tmp_path / "cg"
    make_v1(cg, ".", 3 * GiB, 1 * GiB)
    v1 = by_source(detect(proc, cg), "cgroup-v1")
    assert v1.bytes == 2 * GiB
    assert str(cg / "memory") in v1.detail


def test_cgroup_v1_total_inactive_file_not_counted(tmp_path: Path) -> None:
    proc = make_proc(tmp_path, "4:memory:/job\n")
    cg = tmp_path / "cg"
    leaf = make_v1(cg, "job", 10 * GiB, 9 * GiB)
    _write(leaf / "memory.stat", f"cache {6 * GiB}\ntotal_inactive_file {5 * GiB}\n")
    assert by_source(detect(proc, cg), "cgroup-v1").bytes == 6 * GiB


# --------------------------------------------------------------------------------------------------------------
# missing files
# --------------------------------------------------------------------------------------------------------------


def test_missing_files_are_tolerated(tmp_path: Path) -> None:
    # cgroup file names paths that don't exist; memory dir has no limit files at all
    proc = make_proc(tmp_path, "4:memory:/x\n0::/y\n")
    cg = tmp_path / "cg"
    (cg / "memory" / "x").mkdir(parents=True)
    (cg / "y").mkdir(parents=True)
    budget = detect(proc, cg)
    assert sources(budget) == {"os-available"}
    assert budget.effective.bytes == 48 * GiB


def test_no_proc_self_cgroup(tmp_path: Path) -> None:
    proc = make_proc(tmp_path, None)
    cg = tmp_path / "cg"
    make_v2(cg, {"": (str(1 * GiB), 0)})
    assert sources(detect(proc, cg)) == {"os-available"}


# --------------------------------------------------------------------------------------------------------------
# Slurm
# --------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "expected"),
    [("4096", 4 * GiB), ("16G", 16 * GiB), ("2048M", 2 * GiB), ("1T", 1024 * GiB), ("16g", 16 * GiB)],
)
def test_slurm_mem_per_node(tmp_path: Path, value: str, expected: int) -> None:
    proc = make_proc(tmp_path, None)
    env = {"SLURM_JOB_ID": "123", "SLURM_MEM_PER_NODE": value}
    budget = detect(proc, tmp_path / "cg", env)
    slurm = by_source(budget, "slurm-mem-per-node")
    assert slurm.bytes == expected
    assert "SLURM_MEM_PER_NODE" in slurm.detail and "usage unknown" in slurm.detail


@pytest.mark.parametrize(
    ("cpu_env", "cpus"),
    [
        ({"SLURM_CPUS_ON_NODE": "8", "SLURM_CPUS_PER_TASK": "2"}, 8),
        ({"SLURM_CPUS_PER_TASK": "3", "SLURM_JOB_CPUS_PER_NODE": "16"}, 3),
        ({"SLURM_JOB_CPUS_PER_NODE": "4(x2)"}, 4),
        ({"SLURM_JOB_CPUS_PER_NODE": "6,2"}, 6),
        ({}, 1),
    ],
)
def test_slurm_mem_per_cpu(tmp_path: Path, cpu_env: dict[str, str], cpus: int) -> None:
    proc = make_proc(tmp_path, None)
    env = {"SLURM_JOB_ID": "9", "SLURM_MEM_PER_CPU": "1024", **cpu_env}
    budget = detect(proc, tmp_path / "cg", env)
    slurm = by_source(budget, "slurm-mem-per-cpu")
    assert slurm.bytes == cpus * GiB
    assert budget.effective == slurm  # 48 GiB available is looser


def test_slurm_ignored_without_job_id(tmp_path: Path) -> None:
    proc = make_proc(tmp_path, None)
    env = {"SLURM_MEM_PER_NODE": "1G", "SLURM_MEM_PER_CPU": "100"}
    assert sources(detect(proc, tmp_path / "cg", env)) == {"os-available"}


def test_slurm_zero_and_garbage_are_no_limit(tmp_path: Path) -> None:
    proc = make_proc(tmp_path, None)
    env = {"SLURM_JOB_ID": "1", "SLURM_MEM_PER_NODE": "0", "SLURM_MEM_PER_CPU": "lots"}
    assert sources(detect(proc, tmp_path / "cg", env)) == {"os-available"}


# --------------------------------------------------------------------------------------------------------------
# RLIMIT_AS
# --------------------------------------------------------------------------------------------------------------


def test_rlimit_given_is_recorded_but_not_effective(tmp_path: Path) -> None:
    proc = make_proc(tmp_path, None)
    budget = detect(proc, tmp_path / "cg", rlimit_as=1 * GiB)  # far below the 48 GiB available
    assert budget.address_space_limit == 1 * GiB
    rl = by_source(budget, "rlimit-as")
    assert rl.bytes == 1 * GiB
    assert "VIRTUAL" in rl.detail
    assert budget.effective.source == "os-available"


def test_rlimit_unlimited(tmp_path: Path) -> None:
    proc = make_proc(tmp_path, None)
    budget = detect(proc, tmp_path / "cg", rlimit_as=resource.RLIM_INFINITY)
    assert budget.address_space_limit is None
    assert "rlimit-as" not in sources(budget)


def test_rlimit_read_from_process_when_not_given(tmp_path: Path) -> None:
    proc = make_proc(tmp_path, None)
    budget = detect_memory_limits(proc_root=str(proc), sys_root=str(tmp_path / "cg"), environ={})
    soft = resource.getrlimit(resource.RLIMIT_AS)[0]
    assert budget.address_space_limit == (None if soft == resource.RLIM_INFINITY else soft)


# --------------------------------------------------------------------------------------------------------------
# effective
# --------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("available", "v2_headroom", "v1_headroom", "slurm", "winner"),
    [
        (10 * GiB, 20 * GiB, 30 * GiB, "40G", "os-available"),
        (40 * GiB, 2 * GiB, 30 * GiB, "40G", "cgroup-v2"),
        (40 * GiB, 20 * GiB, 3 * GiB, "40G", "cgroup-v1"),
        (40 * GiB, 20 * GiB, 30 * GiB, "4G", "slurm-mem-per-node"),
    ],
)
def test_effective_is_tightest_and_named(
    tmp_path: Path, available: int, v2_headroom: int, v1_headroom: int, slurm: str, winner: str
) -> None:
    proc = make_proc(tmp_path, "4:memory:/j\n0::/j\n", total=64 * GiB, available=available)
    cg = tmp_path / "cg"
    make_v2(cg, {"j": (str(v2_headroom + GiB), GiB)})
    make_v1(cg, "j", v1_headroom + GiB, GiB)
    env = {"SLURM_JOB_ID": "5", "SLURM_MEM_PER_NODE": slurm}
    budget = detect(proc, cg, env, rlimit_as=1)  # a tiny RLIMIT_AS must never win
    assert sources(budget) == {"os-available", "cgroup-v2", "cgroup-v1", "slurm-mem-per-node", "rlimit-as"}
    assert budget.effective.source == winner
    assert budget.effective.bytes == min(lim.bytes for lim in budget.limits if lim.source != "rlimit-as")


def test_detect_on_this_machine() -> None:
    budget = detect_memory_limits()
    assert budget.effective in budget.limits
    assert budget.effective.source != "rlimit-as"
    assert 0 < budget.effective.bytes <= by_source(budget, "os-available").bytes
    assert budget.total_ram and budget.total_ram > 0


# --------------------------------------------------------------------------------------------------------------
# cores
# --------------------------------------------------------------------------------------------------------------


def _affinity() -> int:
    return len(os.sched_getaffinity(0))


def test_cores_follow_a_cgroup_v2_quota_up_the_tree(tmp_path: Path) -> None:
    proc = make_proc(tmp_path, "0::/kubepods/pod/ctr\n")
    cg = tmp_path / "cg"
    _write(cg / "cgroup.controllers", "cpu memory\n")
    _write(cg / "kubepods" / "pod" / "ctr" / "cpu.max", "max 100000\n")  # the leaf: no quota
    _write(cg / "kubepods" / "pod" / "cpu.max", "150000 100000\n")  # 1.5 CPUs for the pod: 2 threads
    assert usable_cores(proc_root=str(proc), sys_root=str(cg)) == min(_affinity(), 2)
    _write(cg / "kubepods" / "pod" / "cpu.max", "50000 100000\n")  # half a CPU still runs one thread
    assert usable_cores(proc_root=str(proc), sys_root=str(cg)) == 1


def test_cores_follow_a_cgroup_v1_cfs_quota(tmp_path: Path) -> None:
    proc = make_proc(tmp_path, "4:cpu,cpuacct:/docker/abc\n3:memory:/docker/abc\n")
    cg = tmp_path / "cg"
    level = cg / "cpu,cpuacct" / "docker" / "abc"
    _write(level / "cpu.cfs_quota_us", "100000\n")
    _write(level / "cpu.cfs_period_us", "100000\n")
    assert usable_cores(proc_root=str(proc), sys_root=str(cg)) == 1
    _write(level / "cpu.cfs_quota_us", "-1\n")  # no quota
    assert usable_cores(proc_root=str(proc), sys_root=str(cg)) == _affinity()


def test_cores_without_cgroups_or_with_garbage_are_the_affinity(tmp_path: Path) -> None:
    proc = make_proc(tmp_path, "0::/x\n")
    cg = tmp_path / "cg"
    assert usable_cores(proc_root=str(proc), sys_root=str(cg)) == _affinity()
    _write(cg / "cgroup.controllers", "cpu\n")
    for text in ("", "lots 100000", "100000 0", "-5 100000", "\x00\xff"):
        _write(cg / "x" / "cpu.max", text)
        assert usable_cores(proc_root=str(proc), sys_root=str(cg)) == _affinity(), text
    assert usable_cores(proc_root=str(tmp_path / "no-proc"), sys_root=str(cg)) == _affinity()


# --------------------------------------------------------------------------------------------------------------
# disk
# --------------------------------------------------------------------------------------------------------------


def test_free_disk_bytes_on_missing_nested_path(tmp_path: Path) -> None:
    target = tmp_path / "not" / "yet" / "there" / "out"
    free = free_disk_bytes(target)
    assert not target.exists() and not (tmp_path / "not").exists()
    st = os.statvfs(tmp_path)
    assert abs(free - st.f_bavail * st.f_frsize) < 64 * MiB  # other writers may change it a bit
    assert free > 0


def test_free_disk_bytes_existing_file_and_relative(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    f = tmp_path / "file.bin"
    f.write_bytes(b"x")
    monkeypatch.chdir(tmp_path)
    st = os.statvfs(tmp_path)
    expected = st.f_bavail * st.f_frsize
    assert abs(free_disk_bytes(f) - expected) < 64 * MiB
    assert abs(free_disk_bytes("rel/new/dir") - expected) < 64 * MiB
