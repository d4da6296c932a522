"""Predict a universal conversion from its plan: our peak RSS, disk and time, and DeepSpeed's disk for the
same job (`ds_to_universal` keeps a temporary fragment per parameter, rank and state until it merges, and
its stage-3 `optimizer_state.pt` carries rank 0's whole flat optimizer state)."""

from __future__ import annotations

from inspector.convert.kinds.universal.plan import UniFile, UniversalPlan
from inspector.convert.kinds.universal.tensors import chunk_elems
from inspector.convert.preflight import (
    RUNTIME_OVERHEAD,
    SAFETY_FRACTION,
    THREAD_STACK,
    Assessment,
    converter_base,
    kept_records,
    read_seconds,
)
from inspector.convert.root import refuses_new_entries
from inspector.scan.slices import segments_nbytes
from inspector.system.bytesource import any_remote
from inspector.system.limits import MemoryBudget, detect_memory_limits, free_disk_bytes, unwritable

# calibrated on the 0.5B ZeRO-3 demo (README "Universal checkpoints"): bytes written per second
UNI_BYTES_PER_S = 200 * 1024 * 1024
STARTUP_SECONDS = 1.5
# calibrated: what a universal export holds beyond the safetensors converter's base and its own chunk
# buffers (rank 0's optimizer state tree for optimizer_state.pt, the pickler, the worker pool). Measured
# peak minus the prediction without it: 18, 17 and 13 MiB on 2M, 20M and 100M-parameter ZeRO-3 demos.
UNIVERSAL_RUNTIME = 18 * 1024 * 1024


def deepspeed_peak_disk(plan: UniversalPlan, stage3_rank0_optim: int = 0) -> int:
    """ds_to_universal's disk at its peak: the output plus a temporary fragment per parameter, rank and state
    until it merges; its stage-3 optimizer_state.pt carries rank 0's whole flat optimizer state."""
    out = plan.total_bytes
    return 2 * plan.tensor_bytes + stage3_rank0_optim + (out - plan.tensor_bytes)


def assess_universal(
    plan: UniversalPlan,
    budget: MemoryBudget | None = None,
    free_disk: int | None = None,
    *,
    workers: int | None = None,
    stage3_rank0_optim: int = 0,
) -> Assessment:
    """The one verdict (`preflight.Assessment`, the same headroom and RLIMIT_AS check as every kind) for a
    universal export. Memory is predicted for a fresh converter process: its calibrated base and scanned
    metadata, the chunk buffers of the files in flight, and the same runtime allowance."""
    out = plan.total_bytes
    read = sum(segments_nbytes(f.segments) for f in plan.files)
    read += sum(size for _, _, size in plan.copies)
    base, vms = converter_base(
        segments=sum(kept_records(f.segments) for f in plan.files),
        tensors=len({f.name for f in plan.files}),
        files=len(plan.source),
    )
    n = workers or 1
    peak = base + buffer_bytes(plan, n) + RUNTIME_OVERHEAD + UNIVERSAL_RUNTIME
    vms_peak = vms + buffer_bytes(plan, n) + RUNTIME_OVERHEAD + UNIVERSAL_RUNTIME + (n + 1) * THREAD_STACK
    budget = budget or detect_memory_limits()
    free = free_disk if free_disk is not None else free_disk_bytes(plan.out_root)
    blocked = unwritable(plan.out_root) or refuses_new_entries(plan.out_root)  # modes, then a real try
    headroom = int(budget.effective.bytes * (1 - SAFETY_FRACTION))
    return Assessment(
        predicted_peak_rss=peak,
        predicted_vms=vms_peak,
        output_bytes=out,
        read_bytes=read,
        timer=lambda: universal_seconds(plan, n, read),
        deepspeed_peak_rss=0,  # not modelled for ds_to_universal; its disk is (deepspeed_peak_disk)
        budget=budget,
        free_disk=free,
        out_dir=plan.out_root,
        fits_memory=peak <= headroom,
        fits_disk=out <= free and not blocked,
        fits_address_space=budget.address_space_limit is None or vms_peak <= budget.address_space_limit,
        unwritable=blocked,
        calibrated=not any_remote(plan.sources),
    )


def universal_seconds(plan: UniversalPlan, workers: int, read: int) -> float:
    """The export's time: from an object store the network's model; locally the one calibrated model
    (`convert.calibrate`, as convert and health use) for what it does: every tensor file's bytes read and
    zipped (a 16-bit source's widening, a shift, is in the zip's cost), the model-states files copied,
    `workers` files at once; from a cold page cache each tensor's next window read ahead (`READ_AHEAD`), so
    the disk works beside the CPU."""
    if any_remote(plan.sources):
        return STARTUP_SECONDS + max(plan.total_bytes / UNI_BYTES_PER_S, read_seconds(read, plan.sources))
    from inspector.convert.calibrate import Work, calibrated_seconds
    from inspector.convert.kinds.universal.shared_rows import universal_reads

    reads, ranges = universal_reads(plan.files, workers)
    copied = sum(size for *_, size in plan.copies)
    work = Work(
        read=read,
        copied=copied,
        zipped=plan.tensor_bytes,
        written=plan.total_bytes - plan.tensor_bytes - copied,
        pieces=len(plan.files),
        files=len(plan.files) + len(plan.copies),  # one a parameter and state: many small ones add up
        overlapped=False,  # a worker reads a chunk, then checksums and writes it, then reads the next,
        read_ahead=True,  # but from a cold page cache the kernel reads its next 16 MiB meanwhile
        ranges=ranges,
        gathered_reads=True,  # its stripes' and tensors' ranges gathered by `read_runs`, as health's
        startup=plan.scan_cpu,
    )
    return calibrated_seconds(plan.sources, reads, work, workers)


def buffer_bytes(plan: UniversalPlan, workers: int) -> int:
    """Resident chunk buffers at their peak: each worker streams one file at a time with a share of the one
    budget (`tensors.chunk_elems`), and its buffers live only as long as that file, so at most the `workers`
    largest per-file needs are resident together, never more than the budget; and the rows of the stripes
    kept (`shared_rows.STRIPE_BUDGET`) where small stage-3 files are gathered from them."""
    from inspector.convert.kinds.universal.shared_rows import STRIPE_BUDGET, any_striped

    chunk = chunk_elems(workers)
    needs = sorted((_file_buffers(f, chunk) for f in plan.files), reverse=True)
    return sum(needs[:workers]) + (STRIPE_BUDGET if any_striped(plan.files) else 0)


def _file_buffers(f: UniFile, chunk: int) -> int:
    """What `tensors._producer` touches for `f`: the worker's fp32 chunk buffer and, for a 16-bit source, its
    uint16 staging buffer (widened in place); a file smaller than a chunk touches only its own size."""
    n = min(f.nbytes, chunk * 4)  # fp32 bytes of the largest chunk
    if f.source_dtype != "float32":
        n += n // 2
    return n
