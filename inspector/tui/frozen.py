"""Fixed machine figures (memory, disk, RSS) so snapshots and README screenshots are the same on every run.

`frozen_assess` builds the preflight's Assessment from the plan's real numbers plus a pretend machine;
`fake_progress` is the event stream a converter child would print.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from inspector.convert.plan import ConversionPlan
from inspector.convert.preflight import RUNTIME_OVERHEAD, Assessment, predict_deepspeed_peak
from inspector.scan.model import Kind
from inspector.system.limits import MemoryBudget, MemoryLimit
from inspector.system.units import format_bytes

BASE_RSS = 280 * 2**20


def frozen_assess(
    available: int = 24 * 2**30, free_disk: int = 400 * 2**30
) -> Callable[[ConversionPlan, str], Assessment]:
    """An `assess` stand-in for a machine with `available` memory and `free_disk` bytes free."""

    def assess(plan: ConversionPlan, out_dir: str) -> Assessment:
        limit = MemoryLimit(
            available, "os-available", f"MemAvailable = {format_bytes(available)} (pretend machine)"
        )
        tensors = [t for s in plan.shards for t in s.tensors]
        trainable = sum(t.numel for t in tensors if t.kind is not Kind.BUFFER and t.src_dtype == "float32")
        other = sum(sum(seg.nbytes for seg in t.segments) for t in tensors if t.src_dtype != "float32")
        peak = BASE_RSS + plan.buffer_bytes + RUNTIME_OVERHEAD
        return Assessment(
            predicted_peak_rss=peak,
            predicted_vms=peak * 4,
            output_bytes=plan.output_bytes,
            read_bytes=plan.read_bytes,
            estimated_seconds=3.0 + plan.output_bytes / (350 * 2**20),
            deepspeed_peak_rss=predict_deepspeed_peak(plan, trainable, other),
            budget=MemoryBudget((limit,), limit),
            free_disk=free_disk,
            out_dir=out_dir,
            fits_memory=peak <= available * 0.95,
            fits_disk=plan.output_bytes <= free_disk,
            fits_address_space=True,
        )

    return assess


def fake_progress(plan: ConversionPlan, fraction: float, seconds: float = 6.0) -> Iterator[dict[str, Any]]:
    """The `progress` event a converter would print at `fraction` of `plan`."""
    total = sum(s.file_bytes for s in plan.shards)
    done = int(total * fraction)
    pos = 0
    for i, s in enumerate(plan.shards):
        if done < pos + s.file_bytes or i == len(plan.shards) - 1:
            tensor = s.tensors[len(s.tensors) // 2].name if s.tensors else ""
            yield {
                "event": "progress",
                "bytes_done": done,
                "bytes_total": total,
                "tensor": tensor,
                "shard": s.filename,
                "shard_index": i,
                "shards": len(plan.shards),
                "shard_done": min(done - pos, s.file_bytes),
                "shard_total": s.file_bytes,
                "elapsed": seconds,
                "throughput": done / seconds,
            }
            return
        pos += s.file_bytes
