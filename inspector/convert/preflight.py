"""Predict a conversion's peak RSS, disk and time from the plan alone, and hold them against real limits.

Our converter's memory is flat by construction. The prediction is for the converter process, a fresh
`zero-inspector convert` (interpreter, numpy, ml_dtypes, the CLI, no torch), not for the process asking:
its base, plus the scanned metadata (which grows with tensors, segments and files), plus the executor's
fixed chunk buffers and an allowance for threads, casts and the allocator. So the CLI, the TUI (which has
textual loaded) and a script all get the same answer for the same plan. For
DeepSpeed's zero_to_fp32 / zero_to_torch the model follows its code (see predict_deepspeed_peak); its 16-bit
module copy is loaded and dropped before the optimizer files, so it does not add to the peak.
Constants marked "calibrated" come from `tox -e bench` on the reference machine (see README).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from inspector.convert.plan import ConversionPlan
from inspector.convert.root import refuses_new_entries
from inspector.scan.model import Kind, Runs, Segment
from inspector.scan.slices import RankSlices, segments_files
from inspector.system.limits import MemoryBudget, detect_memory_limits, free_disk_bytes, unwritable
from inspector.system.units import format_bytes

# calibrated: peak RSS of a fresh `zero-inspector convert` process before its buffers (interpreter, numpy,
# ml_dtypes, psutil, rich, our modules), and its address space (numpy's and glibc's reservations)
CONVERTER_BASE_RSS = 40 * 1024 * 1024
CONVERTER_BASE_VMS = 480 * 1024 * 1024
# calibrated: scanned metadata kept while converting, per segment / tensor / checkpoint file
METADATA_PER_SEGMENT = 300
METADATA_PER_TENSOR = 2048
# per file: 16 KiB until the ranks' records were compacted (issue 43); the 20M ZeRO-3 demo's convert peaks at
# 71 / 76 / 90 MiB at 8 / 1,024 / 4,096 ranks: ~2.4 KiB a file, kept with margin
METADATA_PER_FILE = 4 * 1024
# calibrated: allowance on top of the chunk buffers for the reader/writer/cast threads, their temporaries
# (an `isnan` mask per cast piece), queues and allocator slack
RUNTIME_OVERHEAD = 16 * 1024 * 1024
THREAD_STACK = 8 * 1024 * 1024
# calibrated: RSS of a Python process that has imported torch and deepspeed and parsed a checkpoint list
DEEPSPEED_BASE_RSS = 250 * 1024 * 1024
# calibrated: interpreter start + imports + scan, then output written / source read per second
# (the estimate uses the slower of the two; both overlap in the executor)
STARTUP_SECONDS = 0.6
CONVERT_BYTES_PER_S = 350 * 1024 * 1024
READ_BYTES_PER_S = 700 * 1024 * 1024
# assumed, not calibrated: one process reading an object store (ranged GETs, ZI_S3_INFLIGHT in flight) is
# bound by the network, not the disk. 100 MiB/s is what 8 requests in flight gave on a capped local store in
# tests/benchmarks/results.md (45-120 MB/s there, by core load); a cloud node often does better, never the
# page cache's 700 MiB/s. The scan's first requests (listings, `latest`, model states) are round trips in turn.
REMOTE_READ_BYTES_PER_S = 100 * 1024 * 1024
REMOTE_STARTUP_SECONDS = 1.0
# calibrated: an object store's client in the process (boto3 or obstore, its connection pool, the reader
# threads' HTTP bodies): a 50M export peaked at 110-129 MiB from S3 against 82 MiB from disk
REMOTE_CLIENT_RSS = 40 * 1024 * 1024
# keep this much headroom below a limit before calling it a fit (other processes, page cache pressure)
SAFETY_FRACTION = 0.05


def read_seconds(read_bytes: int, sources: tuple[Any, ...]) -> float:
    """Time to fetch `read_bytes`, plus the scan's round trips, at the disk's rate or, when any source is on
    an object store, at the network's (`REMOTE_READ_BYTES_PER_S`)."""
    from inspector.system.bytesource import any_remote

    if any_remote(sources):
        return REMOTE_STARTUP_SECONDS + read_bytes / REMOTE_READ_BYTES_PER_S
    return read_bytes / READ_BYTES_PER_S


@dataclass(frozen=True)
class Assessment:
    """Predictions, limits and the verdict for one planned conversion."""

    predicted_peak_rss: int
    predicted_vms: int
    output_bytes: int
    read_bytes: int
    timer: Callable[[], float] = field(compare=False, repr=False)  # the run's time, asked only when shown
    deepspeed_peak_rss: int
    budget: MemoryBudget
    free_disk: int
    out_dir: str
    fits_memory: bool
    fits_disk: bool
    fits_address_space: bool
    unwritable: str = ""  # why the output cannot be created there ("" when it can)
    upload_to: str = ""  # OUT is this bucket URL: `out_dir` is the staging folder, which holds only
    staged_bytes: int = 0  # this much at once (the largest files written side by side)
    calibrated: bool = False  # the time was calibrated on this machine (not from fixed rates)

    @cached_property
    def estimated_seconds(self) -> float:
        """The run's predicted time. Computed when first asked, not when assessed: the calibration behind it
        reads and casts a probe of the checkpoint, and `convert` asks only whether the run fits."""
        return self.timer()

    @property
    def disk_need(self) -> int:
        """Local disk the run needs: the whole output, or for a bucket only what is staged at once."""
        return self.staged_bytes if self.upload_to else self.output_bytes

    @property
    def fits(self) -> bool:
        return self.fits_memory and self.fits_disk and self.fits_address_space

    @property
    def memory_margin(self) -> int:
        return self.budget.effective.bytes - self.predicted_peak_rss

    @property
    def disk_margin(self) -> int:
        return self.free_disk - self.disk_need

    @property
    def problem(self) -> str:
        parts = []
        if not self.fits_memory:
            parts.append(
                f"it needs about {format_bytes(self.predicted_peak_rss)} of RAM but only "
                f"{format_bytes(self.budget.effective.bytes)} is available ({self.budget.effective.detail})"
            )
        if not self.fits_address_space:
            parts.append(
                f"RLIMIT_AS ({format_bytes(self.budget.address_space_limit or 0)}) is below the "
                f"{format_bytes(self.predicted_vms)} of address space the converter needs"
            )
        if self.unwritable:
            parts.append(f"the output cannot be written: {self.unwritable}")
        elif not self.fits_disk:
            what = "staging its files for the upload" if self.upload_to else "the output"
            parts.append(
                f"{what} needs {format_bytes(self.disk_need)} but {self.out_dir} has "
                f"{format_bytes(self.free_disk)} free"
            )
        text = "; ".join(parts)
        return f"{text[0].upper()}{text[1:]}." if parts else ""

    @property
    def advice(self) -> str:
        tips = []
        if self.unwritable:
            tips.append("choose an output folder you can write to")
        elif not self.fits_disk:
            tips.append(
                "free disk space or stage on another disk (--staging DIR)"
                if self.upload_to
                else "free disk space or choose an output folder on another disk"
            )
        if not self.fits_memory:
            tips.append(
                "stop other processes or raise the memory limit; our peak does not depend on model or "
                "shard size, so a smaller --shard-size will not help here"
            )
        if not self.fits_address_space:
            tips.append("raise `ulimit -v`")
        tips.append("--force starts anyway")
        return "; ".join(tips).capitalize() + "."


def convert_seconds(plan: ConversionPlan, output_bytes: int) -> float:
    """The run's time: from an object store the network's model (`read_seconds`); locally calibrated on this
    machine and this checkpoint's files (`calibrate`: its pages' residency, a bounded read probe, a cast,
    the cores; a few milliseconds) for the plan's workers."""
    if plan.remote:
        return STARTUP_SECONDS + max(
            output_bytes / CONVERT_BYTES_PER_S, read_seconds(plan.read_bytes, plan.sources)
        )
    from collections import Counter

    from inspector.convert.calibrate import Work, calibrated_seconds
    from inspector.convert.pipeline import plan_threads, pool_plan, shards_at_once
    from inspector.convert.stripes import plan_reads

    tensors = [t for s in plan.shards for t in s.tensors]
    reads, ranges = plan_reads(plan, pool_plan(plan, plan_threads(plan))[1])  # as the pipeline reads
    casts = Counter({(t.src_dtype, t.out_dtype): t.numel for t in tensors if t.src_dtype != t.out_dtype})
    pair = casts.most_common(1)[0][0] if casts else ("float32", "bfloat16")
    copied = sum(t.nbytes for t in tensors if t.src_dtype == t.out_dtype)
    work = Work(
        read=plan.read_bytes,
        written=output_bytes - copied,
        cast_elems=sum(t.numel for t in tensors if t.src_dtype != t.out_dtype),
        copied=copied,
        outputs=shards_at_once(plan),
        files=len(plan.shards),
        ranges=ranges,
        startup=plan.scan_cpu,
    )
    return calibrated_seconds(plan.sources, reads, work, plan_threads(plan), pair)


def converter_base(segments: int, tensors: int, files: int, extra: int = 0) -> tuple[int, int]:
    """(RSS, VMS) of a fresh converter process that has scanned `files` checkpoint files into `tensors`
    tensors of `segments` segments and planned (`extra`: planned bytes it keeps, e.g. shard headers), before
    its buffers. Every writer's prediction starts here (safetensors, universal)."""
    meta = METADATA_PER_SEGMENT * segments + METADATA_PER_TENSOR * tensors + METADATA_PER_FILE * files + extra
    return CONVERTER_BASE_RSS + meta, CONVERTER_BASE_VMS + meta


def kept_records(segments: Sequence[Segment]) -> int:
    """How many records a tensor's segments keep at rest: a stage-3 parameter's slices over every rank are one
    `RankSlices` (its per-rank table shared by the sub-group), a strided join its `Strided` blocks; a tuple one
    record per segment. Counting the segments a compact record stands for predicted a 4,096-rank ZeRO-3
    conversion at 252 MiB that peaked at 96."""
    if isinstance(segments, RankSlices):
        return 1
    if isinstance(segments, Runs):
        return len(segments.blocks)
    return len(segments)


def converter_baseline(plan: ConversionPlan) -> tuple[int, int]:
    """(RSS, VMS) of a fresh converter process once it has scanned and planned, before its buffers."""
    segments = sum(kept_records(t.segments) for s in plan.shards for t in s.tensors)
    files = len({f for s in plan.shards for t in s.tensors for f in segments_files(t.segments)})
    return converter_base(segments, plan.tensor_count, files, sum(len(s.header) for s in plan.shards))


def predict_deepspeed_peak(
    plan: ConversionPlan, trainable_numel: int, other_bytes: int, master_itemsize: int = 4
) -> int:
    """Peak RSS of zero_to_fp32/zero_to_torch for the same job.

    Every optimizer file is torch.load'ed with mmap and the fp32 partitions are read, so their pages become
    resident (4 B/param). Stage 1/2 then torch.cat each group (another 4 B/param: "memory usage doubles
    here"). Stage 3 gathers lazily, so instead one output shard is materialised at a time. Fitted on
    `tox -e bench` (0.5B and 1B params): stage 2 measured 4243 / 8439 MiB, this gives 4250 / 8446 MiB.
    """
    mmap_pages = master_itemsize * trainable_numel
    if plan.stage == 3:
        shard = min(plan.options.shard_size, plan.tensor_bytes)
        return DEEPSPEED_BASE_RSS + mmap_pages + shard + other_bytes
    merged = master_itemsize * trainable_numel
    return DEEPSPEED_BASE_RSS + mmap_pages + merged + other_bytes


def assess(
    plan: ConversionPlan,
    out_dir: str,
    budget: MemoryBudget | None = None,
    free_disk: int | None = None,
    *,
    extra_output_bytes: int = 0,
    extra_memory: int = 0,
) -> Assessment:
    """Predict the converter process's needs and compare them with this machine's limits.

    `extra_output_bytes` / `extra_memory`: files written beside the shards (config, tokenizer) and working
    memory beyond the chunk buffers (a LoRA merge's fp32 blocks, `MergedPlan.work_bytes`), from the kind's
    job (`SafetensorsJob.assess`)."""
    from inspector.convert.pipeline import plan_threads

    rss, vms = converter_baseline(plan)
    client = REMOTE_CLIENT_RSS if plan.remote else 0
    peak = rss + plan.buffer_bytes + RUNTIME_OVERHEAD + extra_memory + client
    threads = 1 + max(plan_threads(plan), plan.depth if plan.remote else 0)  # the producer, the workers
    vms_peak = vms + plan.buffer_bytes + RUNTIME_OVERHEAD + extra_memory + client + threads * THREAD_STACK
    output_bytes = plan.output_bytes + extra_output_bytes
    budget = budget or detect_memory_limits()
    free = free_disk if free_disk is not None else free_disk_bytes(out_dir)
    tensors = [t for s in plan.shards for t in s.tensors]
    # DeepSpeed always reads the fp32 masters of trainable params, whichever source we read
    masters = [t for t in tensors if t.kind in (Kind.TRAINABLE, Kind.TIED) or t.src_dtype == "float32"]
    trainable = sum(t.numel for t in masters if t.kind is not Kind.BUFFER)
    chosen = {id(t) for t in masters}  # by identity: `t not in masters` compared dataclasses, n^2
    other = sum(sum(seg.nbytes for seg in t.segments) for t in tensors if id(t) not in chosen)
    ds_peak = predict_deepspeed_peak(plan, trainable, other)
    headroom = int(budget.effective.bytes * (1 - SAFETY_FRACTION))
    blocked = unwritable(out_dir) or refuses_new_entries(out_dir)  # modes, then a real try
    return Assessment(
        predicted_peak_rss=peak,
        predicted_vms=vms_peak,
        output_bytes=output_bytes,
        read_bytes=plan.read_bytes,
        timer=lambda: convert_seconds(plan, output_bytes),
        deepspeed_peak_rss=ds_peak,
        budget=budget,
        free_disk=free,
        out_dir=out_dir,
        fits_memory=peak <= headroom,
        fits_disk=output_bytes <= free and not blocked,
        fits_address_space=budget.address_space_limit is None or vms_peak <= budget.address_space_limit,
        unwritable=blocked,
        calibrated=not plan.remote,
    )


def assessment_json(a: Assessment) -> dict[str, Any]:
    """The keys `preflight --json` gives for every output kind (each kind's job adds its own)."""
    out: dict[str, Any] = {
        "fits": a.fits,
        "fits_memory": a.fits_memory,
        "fits_disk": a.fits_disk,
        "fits_address_space": a.fits_address_space,
        "predicted_peak_rss_bytes": a.predicted_peak_rss,
        "output_bytes": a.output_bytes,
        "read_bytes": a.read_bytes,
        "estimated_seconds": round(a.estimated_seconds, 2),
        "available_memory_bytes": a.budget.effective.bytes,
        "memory_limit_source": a.budget.effective.source,
        "memory_limit_detail": a.budget.effective.detail,
        "memory_margin_bytes": a.memory_margin,
        "address_space_limit_bytes": a.budget.address_space_limit,
        "limits": [
            {"source": lim.source, "bytes": lim.bytes, "detail": lim.detail} for lim in a.budget.limits
        ],
        "free_disk_bytes": a.free_disk,
        "output_writable": not a.unwritable,
        "disk_margin_bytes": a.disk_margin,
        "out_dir": a.upload_to or a.out_dir,
        "problem": a.problem,
    }
    if a.upload_to:  # a bucket OUT: what goes up, and what the staging folder holds at once
        out |= {"upload_bytes": a.output_bytes, "staging_dir": a.out_dir, "staging_bytes": a.staged_bytes}
    if a.deepspeed_peak_rss:
        out["deepspeed_zero_to_fp32_peak_rss_bytes"] = a.deepspeed_peak_rss
    return out
