"""A memory ceiling (`MemoryLimit`: the headroom a new process gets under it, and where it comes from) and
every ceiling found on this machine with the tightest one (`MemoryBudget`): what `limits` detects and the
preflight of every output kind respects."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

LimitSource = Literal[
    "os-available", "cgroup-v2", "cgroup-v1", "rlimit-as", "slurm-mem-per-node", "slurm-mem-per-cpu", "chosen"
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


def chosen_budget(nbytes: int, said: str) -> MemoryBudget:
    """A budget the user names (`preflight --ram 16GB`: "fits on a 16 GB node?") instead of this machine's:
    all of it counted as headroom, so the verdict is for a node of that size with nothing else running."""
    limit = MemoryLimit(nbytes, "chosen", f"--ram {said}: a node of this size, not this machine", limit=nbytes)
    return MemoryBudget((limit,), limit, total_ram=nbytes)
