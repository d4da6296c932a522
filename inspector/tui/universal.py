"""The universal-checkpoint output seen through the shapes the export and convert screens read.

`--format universal` has its own plan and estimate (`writers.universal`, `universal_preflight`: the same
numbers `zero-inspector preflight --format universal` prints). These two small views give them the
fields the screens use of a ConversionPlan and an Assessment, so the rest of the flow is shared.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from inspector.convert.options import ConvertOptions
from inspector.convert.writers.universal import UniFile, UniversalPlan
from inspector.convert.writers.universal_preflight import UniversalEstimate
from inspector.system.units import format_bytes

UNIVERSAL = "universal"


@dataclass(frozen=True)
class UniversalPlanView:
    plan: UniversalPlan
    options: ConvertOptions  # the export form's options (a universal checkpoint ignores them)

    @property
    def out_dir(self) -> str:
        return self.plan.out_dir

    @property
    def tensor_count(self) -> int:
        return len({f.name for f in self.plan.files})

    @property
    def shards(self) -> tuple[UniFile, ...]:  # the screens count "file(s)": one .pt per parameter state
        return self.plan.files

    @property
    def file_count(self) -> int:  # what the form shows: every file written, not only the tensor states
        return self.plan.file_count

    @property
    def output_bytes(self) -> int:
        return self.plan.total_bytes


@dataclass(frozen=True)
class UniversalAssessment:
    est: UniversalEstimate

    @property
    def fits(self) -> bool:
        return self.est.fits

    @property
    def fits_memory(self) -> bool:
        return self.est.predicted_peak_rss <= self.est.available_memory

    @property
    def fits_disk(self) -> bool:
        return self.est.output_bytes <= self.est.free_disk

    @property
    def predicted_peak_rss(self) -> int:
        return self.est.predicted_peak_rss

    @property
    def problem(self) -> str:
        e = self.est
        parts = []
        if not self.fits_memory:
            parts.append(
                f"peak RAM {format_bytes(e.predicted_peak_rss)} exceeds {format_bytes(e.available_memory)} "
                f"available ({e.memory_source})"
            )
        if not self.fits_disk:
            parts.append(f"output {format_bytes(e.output_bytes)} exceeds {format_bytes(e.free_disk)} free")
        return "; ".join(parts).capitalize() + "." if parts else ""

    @property
    def advice(self) -> str:
        if not self.fits_disk:
            return "Choose an output folder on a disk with more free space."
        return "Free memory, or run it on a machine with more RAM."


def universal_preflight(
    ckpt: object, opts: ConvertOptions, out_dir: str
) -> tuple[UniversalPlanView, UniversalAssessment]:
    """Plan and estimate the universal checkpoint (in a worker), as `preflight --format universal` does."""
    from inspector.convert.writers.universal import plan_universal
    from inspector.convert.writers.universal_preflight import estimate_universal

    plan = plan_universal(ckpt, os.path.abspath(out_dir or os.getcwd()))  # type: ignore[arg-type]
    stage, ranks = getattr(ckpt, "stage", 0), getattr(ckpt, "ranks", ())
    rank0 = ranks[0].optim_bytes if stage == 3 and ranks else 0
    return UniversalPlanView(plan, opts), UniversalAssessment(
        estimate_universal(plan, stage3_rank0_optim=rank0)
    )
