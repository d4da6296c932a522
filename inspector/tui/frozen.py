"""Fixed machine figures (memory, disk, RSS) so snapshots and README screenshots are the same on every run.

`frozen_assess` is a job's own verdict on a pretend machine;
`fake_progress` is the event stream a converter child would print;
`FROZEN_AGE` is how old a frozen app says the shown tag is.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import replace

from inspector.convert.events import Progressed
from inspector.convert.kinds import Job
from inspector.convert.plan import ConversionPlan
from inspector.convert.preflight import Assessment
from inspector.system.limits import MemoryBudget, MemoryLimit
from inspector.system.units import format_bytes

# seconds: a frozen app's "saved 3 hours ago" (the demo it shows was written seconds ago on one machine and
# days ago on another; the text must not depend on which)
FROZEN_AGE = 3 * 3600 + 17 * 60
# the pretend machine's start-up and bytes/s written and read (preflight's time is calibrated on the real one)
PRETEND_STARTUP = 0.6
PRETEND_WRITE = 350 * 2**20
PRETEND_READ = 700 * 2**20


def frozen_assess(available: int = 24 * 2**30, free_disk: int = 400 * 2**30) -> Callable[[Job], Assessment]:
    """The job's own verdict on a pretend machine with `available` memory and `free_disk` bytes free (the
    predictions are the job's; only the machine is fixed)."""

    def assess(job: Job) -> Assessment:
        limit = MemoryLimit(
            available, "os-available", f"MemAvailable = {format_bytes(available)} (pretend machine)"
        )
        a = job.assess(MemoryBudget((limit,), limit), free_disk)
        if a.calibrated:  # the pretend machine's rates, not this machine's calibrated time
            seconds = PRETEND_STARTUP + max(a.output_bytes / PRETEND_WRITE, a.read_bytes / PRETEND_READ)
            a = replace(a, timer=lambda: seconds)
        return replace(a, unwritable="", fits_disk=a.output_bytes <= free_disk)

    return assess


def fake_progress(plan: ConversionPlan, fraction: float, seconds: float = 6.0) -> Iterator[Progressed]:
    """The `progress` event a converter would print at `fraction` of `plan`."""
    total = sum(s.file_bytes for s in plan.shards)
    done = int(total * fraction)
    pos = 0
    for i, s in enumerate(plan.shards):
        if done < pos + s.file_bytes or i == len(plan.shards) - 1:
            tensor = s.tensors[len(s.tensors) // 2].name if s.tensors else ""
            yield Progressed(
                bytes_done=done,
                bytes_total=total,
                tensor=tensor,
                elapsed=seconds,
                throughput=done / seconds,
                file=s.filename,
                file_index=i,
                files=len(plan.shards) + (1 if plan.index else 0),
                files_done=i,  # the shards before this one
                file_done=min(done - pos, s.file_bytes),
                file_total=s.file_bytes,
            )
            return
        pos += s.file_bytes
