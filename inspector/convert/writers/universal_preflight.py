"""Predict a universal conversion from its plan: our peak RSS, disk and time, and DeepSpeed's disk for the
same job (`ds_to_universal` keeps a temporary fragment per parameter, rank and state until it merges, and
its stage-3 `optimizer_state.pt` carries rank 0's whole flat optimizer state)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from inspector.convert.preflight import RUNTIME_OVERHEAD, SAFETY_FRACTION, THREAD_STACK, converter_base
from inspector.convert.writers.universal import CHUNK_BYTES, UniFile, UniversalPlan, default_workers
from inspector.system.limits import detect_memory_limits, free_disk_bytes, unwritable

# calibrated on the 0.5B ZeRO-3 demo (README "Universal checkpoints"): bytes written per second
UNI_BYTES_PER_S = 200 * 1024 * 1024
STARTUP_SECONDS = 1.5


@dataclass(frozen=True)
class UniversalEstimate:
    predicted_peak_rss: int
    output_bytes: int
    read_bytes: int
    estimated_seconds: float
    free_disk: int
    available_memory: int
    memory_source: str
    deepspeed_peak_disk: int  # ds_to_universal: output plus its temporary fragments at their peak
    predicted_vms: int = 0
    address_space_limit: int | None = None
    unwritable: str = ""  # why the output cannot be created there ("" when it can)

    @property
    def fits_memory(self) -> bool:
        """With the same headroom below the limit as the safetensors verdict (preflight.SAFETY_FRACTION)."""
        return self.predicted_peak_rss <= int(self.available_memory * (1 - SAFETY_FRACTION))

    @property
    def fits_disk(self) -> bool:
        return self.output_bytes <= self.free_disk and not self.unwritable

    @property
    def fits_address_space(self) -> bool:
        return self.address_space_limit is None or self.predicted_vms <= self.address_space_limit

    @property
    def fits(self) -> bool:
        return self.fits_memory and self.fits_disk and self.fits_address_space

    def as_dict(self) -> dict[str, Any]:
        """The keys `preflight --json` gives for every output kind (preflight.assessment_json), plus
        DeepSpeed's own peak disk for the same job."""
        return {
            "output_kind": "universal",
            "format": "universal",
            "fits": self.fits,
            "fits_memory": self.fits_memory,
            "fits_disk": self.fits_disk,
            "fits_address_space": self.fits_address_space,
            "output_writable": not self.unwritable,
            "address_space_limit_bytes": self.address_space_limit,
            "predicted_peak_rss_bytes": self.predicted_peak_rss,
            "output_bytes": self.output_bytes,
            "read_bytes": self.read_bytes,
            "estimated_seconds": round(self.estimated_seconds, 2),
            "free_disk_bytes": self.free_disk,
            "available_memory_bytes": self.available_memory,
            "memory_limit_source": self.memory_source,
            "deepspeed_ds_to_universal_peak_disk_bytes": self.deepspeed_peak_disk,
        }


def estimate_universal(
    plan: UniversalPlan, workers: int | None = None, stage3_rank0_optim: int = 0
) -> UniversalEstimate:
    """`stage3_rank0_optim`: bytes of rank 0's flat optimizer state, which DeepSpeed copies (stage 3).

    Memory is predicted for a fresh converter process, as `preflight.assess` does for safetensors (so the
    CLI and the TUI get the same answer): its calibrated base and scanned metadata, the chunk buffers of the
    files in flight, and the same runtime allowance."""
    out = plan.total_bytes
    read = sum(sum(s.nbytes for s in f.segments) for f in plan.files)
    read += sum(os.path.getsize(src) for src, _ in plan.copies)
    base, vms = converter_base(
        segments=sum(len(f.segments) for f in plan.files),
        tensors=len({f.name for f in plan.files}),
        files=len(plan.source),
    )
    n = workers or default_workers()
    peak = base + buffer_bytes(plan, n) + RUNTIME_OVERHEAD
    budget = detect_memory_limits()
    ds_disk = 2 * plan.tensor_bytes + stage3_rank0_optim + (out - plan.tensor_bytes)
    return UniversalEstimate(
        predicted_peak_rss=peak,
        output_bytes=out,
        read_bytes=read,
        estimated_seconds=STARTUP_SECONDS + out / UNI_BYTES_PER_S,
        free_disk=free_disk_bytes(plan.out_root),
        available_memory=budget.effective.bytes,
        memory_source=budget.effective.source,
        deepspeed_peak_disk=ds_disk,
        predicted_vms=vms + buffer_bytes(plan, n) + RUNTIME_OVERHEAD + (n + 1) * THREAD_STACK,
        address_space_limit=budget.address_space_limit,
        unwritable=unwritable(plan.out_root),
    )


def buffer_bytes(plan: UniversalPlan, workers: int) -> int:
    """Resident chunk buffers at their peak: each worker streams one file at a time, and its buffers live
    only as long as that file, so at most the `workers` largest per-file needs are resident together."""
    needs = sorted((_file_buffers(f) for f in plan.files), reverse=True)
    return sum(needs[:workers])


def _file_buffers(f: UniFile) -> int:
    """What `universal._producer` touches for `f`: an fp32 chunk buffer and, for a 16-bit source, a uint16
    staging buffer plus `_widen`'s uint32 temporary. They are `np.empty`, so a file smaller than a chunk
    makes only its own size resident, not CHUNK_BYTES."""
    n = min(f.nbytes, CHUNK_BYTES)  # fp32 bytes of the largest chunk
    if f.source_dtype != "float32":
        n += n // 2 + n
    return n
