"""What one health worker takes at a time: a job, or a stripe of consecutive stage-3 jobs whose per-rank
slices are small (`convert/stripes.py`), read as one window of every rank's flat tensor.

A model with many small parameters saved by many ranks made one read a rank per job (the 126-layer demo
at 1,024 ranks: 3.9 M reads of ~15 elements for its masters and moments, 52 s). A stripe reads each rank
once per run of such jobs into a worker's first raw buffer, then gathers each job's elements (and, with
`--against`, the other tag's, into the next buffer) and reduces them exactly as the job's own chunks would
be: in pieces of the worker's chunk, so the figures are the same bits.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from inspector.convert.stripes import Stripe, grouped, reads_counted, small_slices
from inspector.health.jobs import Job
from inspector.scan.slices import RankSlices

ROW_BYTES = 4  # bytes of rows a stripe reads per chunk element: a worker touches no more than a job does
# (rows in its first raw buffer, each job gathered into the next: 4 + 4 bytes, or 2 + 2 for bf16, within
# the budget's `stream.SCRATCH_PER_ELEM`)

Unit = Job | Stripe[Job]


def parts(job: Job) -> tuple[RankSlices, ...] | None:
    """The slices a job reads in a stripe (its stream, and `--against`'s), or None where it is read on its
    own: a module copy read in step, slices that are not small, streams of two dtypes."""
    if job.module:
        return None
    got = (job.segments, job.against) if job.against else (job.segments,)
    found = tuple(s for s in (small_slices(x) for x in got) if s is not None)
    return found if len(found) == len(got) and len({s.starts.dtype for s in found}) == 1 else None


def _dtype(job: Job) -> str:
    s = job.segments
    return s.starts.dtype if isinstance(s, RankSlices) else ""


def plan_units(jobs: Sequence[Job], chunk: int) -> list[Unit]:
    """The jobs in plan order (module order, as the flat tensors are), runs of small stage-3 jobs of one
    dtype as stripes of at most `chunk` x ROW_BYTES bytes of rows."""
    cap = chunk * ROW_BYTES

    def rows(job: Job) -> int:
        s = job.segments
        return cap // s.starts.itemsize if isinstance(s, RankSlices) else 0

    return list(grouped(jobs, parts, _dtype, rows))


def jobs_of(unit: Unit) -> list[Job]:
    return unit.tensors if isinstance(unit, Stripe) else [unit]


def unit_reads(units: Sequence[Unit]) -> tuple[Counter[str], int]:
    """(bytes read from each file, how many reads) of the pass (`stripes.reads_counted`): a job's stream,
    module copy and `--against`'s, a stripe one read a rank and window."""
    return reads_counted(units, lambda j: (j.segments, j.module, j.against))
