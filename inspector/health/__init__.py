"""Checkpoint health: every tensor's numbers from one streamed read of its bytes, and what they mean.

`check(ckpt, against=...)` reads the fp32 masters, both Adam moments, the 16-bit module copy, frozen parameters
and buffers chunk by chunk on the usable cores (by default at most `limits.LOCAL_THREADS`; memory: one buffer
budget shared by the workers) and yields progress, finished rows and finally a `HealthReport` (rows,
per-submodule roll-ups, findings). No textual, rich or torch.
"""

from inspector.health.check import check, run_check
from inspector.health.findings import HealthFinding, sibling_pattern
from inspector.health.report import HealthProgress, HealthReport, ModuleRollup
from inspector.health.stats import Stats
from inspector.health.stream import Row

__all__ = [
    "HealthFinding",
    "HealthProgress",
    "HealthReport",
    "ModuleRollup",
    "Row",
    "Stats",
    "check",
    "run_check",
    "sibling_pattern",
]
