"""How long the health pass will take on this machine, before it runs: the one calibrated time model that
convert's and universal's preflight use (`convert.calibrate`: residency by mincore, a bounded read probe of
the checkpoint's own files, the cores and the load), fed with what the pass does (every stream it reads is
reduced once, a stream being the most one worker holds at a time), in the chunk the pass itself will choose
(`chunking.pass_chunk`: where a smaller one fits a faster cache, its numpy work is priced at that speed)."""

from __future__ import annotations

from collections.abc import Sequence

import inspector.convert.calibrate as calibration
from inspector.convert.preflight import STARTUP_SECONDS, read_seconds
from inspector.health.chunking import pass_chunk
from inspector.health.jobs import plan_jobs
from inspector.health.stream import plan_units, plan_workers, unit_reads
from inspector.scan.model import Checkpoint, TensorInfo
from inspector.scan.slices import segments_nbytes
from inspector.system.bytesource import any_remote


def health_seconds(
    ckpt: Checkpoint,
    tensors: Sequence[TensorInfo],
    against: Checkpoint | None = None,
    workers: int | None = None,
) -> float:
    """Seconds `health` takes over `tensors` (with `against`: the second tag read in step) on `workers`
    (default: as the pass itself chooses). From an object store the network's model, as convert's."""
    sources = (ckpt.source, *((against.source,) if against else ()))
    jobs = plan_jobs(ckpt, tensors, against)
    total = sum(j.nbytes for j in jobs)
    remote = any_remote(sources)
    if remote:
        return STARTUP_SECONDS + read_seconds(total, sources)
    plan = plan_workers(workers, against is not None)
    threads = plan.threads
    # the chunk the pass will run in, and how much faster than the reduction probe's its numpy work runs
    chunk, speedup = pass_chunk(threads, plan.chunk, total)
    reads, ranges = unit_reads(plan_units(jobs, chunk))
    startup = ckpt.scan_cpu + (against.scan_cpu if against else 0.0)  # the run scans both again
    work = calibration.Work(  # the pass asks its reads ahead from a cold cache (`read_ahead`)
        read=sum(reads.values()),
        reduced=round(total / speedup),
        checked=round(sum(segments_nbytes(j.module) for j in jobs) / speedup),
        pieces=len(jobs),
        read_ahead=True,
        ranges=ranges,
        gathered_reads=True,
        jobs=len(jobs),
        startup=startup,
    )
    return calibration.calibrated_seconds(tuple(set(sources)), reads, work, threads)
