"""A memory ceiling (`MemoryLimit`: the headroom a new process gets under it, and where it comes from) and
every ceiling found on this machine with the tightest one (`MemoryBudget`): what `limits` detects and the
preflight of every output kind respects."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

LimitSource = Literal[
    "os-available", "cgroup-v2", "cgroup-v1", "rlimit-as", "slurm-mem-per-node", "slurm-mem-per-cpu"
]


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
