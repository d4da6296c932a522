"""The health pass: select, stream, roll up, judge. A generator of progress and finished rows, then the report."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import replace

from inspector.convert.options import ConvertOptions, select
from inspector.convert.reader import FilePool
from inspector.errors import InspectorError
from inspector.health.against import against_label
from inspector.health.chunking import pass_chunk
from inspector.health.findings import HealthFinding, Steps, findings, missing_in_against, shape_changed
from inspector.health.jobs import Job
from inspector.health.report import SOURCES, HealthProgress, HealthReport, rollup
from inspector.health.since import refuse_damaged
from inspector.health.stream import (
    Row,
    Streamer,
    plan_jobs,
    plan_units,
    plan_workers,
    read_ahead,
    run_jobs,
)
from inspector.health.units import Unit, jobs_of, unit_reads
from inspector.scan.model import Checkpoint, Severity, TensorInfo
from inspector.system.bytesource import any_remote

_INTERVAL = 0.25


def check(
    ckpt: Checkpoint,
    against: Checkpoint | None = None,
    include: Sequence[str] = (),
    exclude: Sequence[str] = (),
    workers: int | None = None,
    cancel: threading.Event | None = None,
    chunk_elems: int | None = None,
    threads: int | None = None,
) -> Iterator[HealthProgress | list[Row] | HealthReport]:
    """Yield progress (at most 4/s), each tensor's rows as they finish, then the HealthReport.

    Workers default to the usable cores, at most `limits.LOCAL_THREADS` (more from an object store; locally
    never more than the cores, `limits.busy_threads`); they share one buffer budget, which sets their chunk
    (`stream.plan_workers`): the figures are the same bits whatever their number; from a cold page cache
    each worker has the kernel read its next chunk while it reduces this one (`stream.read_ahead`). `threads`
    is the older name of `workers`. Raises CancelledError when `cancel` is set, InspectorError for unreadable bytes, and
    DamagedCheckpointError, before reading anything, when `against` has error findings."""
    start = time.monotonic()
    if against is not None:
        refuse_damaged(against)
    cancel = cancel or threading.Event()
    sources = (ckpt.source, *((against.source,) if against else ()))
    remote = any_remote(sources)
    plan = plan_workers(workers or threads, against is not None, remote)
    jobs = plan_jobs(ckpt, _selected(ckpt, include, exclude), against)
    chunk = chunk_elems or plan.chunk
    if not (chunk_elems or remote):  # the caches' size, timed
        chunk = pass_chunk(plan.threads, chunk, sum(j.nbytes for j in jobs)).chunk
    units = plan_units(jobs, chunk)
    by_file = unit_reads(units)[0]  # once: thousands of ranks make it long
    rows: list[Row] = []
    with FilePool(*set(sources)) as pool:
        streamer = Streamer(pool, cancel, chunk, read_ahead(pool, units, by_file))
        yield from _stream(units, streamer, plan.threads, rows, sum(by_file.values()))
        read = streamer.done_bytes
    order = {t.name: i for i, t in enumerate(ckpt.tensors)}
    rows.sort(key=lambda r: (order[r.name], SOURCES.index(r.source)))
    yield HealthReport(
        tag=ckpt.tag,
        against=against_label(ckpt, against),
        stage=ckpt.stage,
        rows=tuple(rows),
        modules=tuple(rollup(rows)),
        findings=tuple(_findings(ckpt, against, rows, jobs)),
        bytes_read=read,
        seconds=time.monotonic() - start,
        threads=plan.threads,
    )


def _selected(ckpt: Checkpoint, include: Sequence[str], exclude: Sequence[str]) -> list[TensorInfo]:
    tensors = select(ckpt, ConvertOptions(include=tuple(include), exclude=tuple(exclude)))
    if not ckpt.tensors:  # not the patterns: the scan could name no tensor (ZeRO-off order unproven, ...)
        e = f" ({ckpt.errors[0].message.rstrip('.')})" if ckpt.errors else ""
        raise InspectorError(
            f"The scan named no tensor to measure{e}.",
            hint="Run `zero-inspector scan` to see every finding.",
            title="Nothing to measure",
        )
    if not tensors:
        raise InspectorError(
            "No tensor matches the --include/--exclude patterns.",
            hint="Patterns are globs or module prefixes, e.g. 'model.layers.0' or '*.mlp.*'.",
            title="Nothing selected",
        )
    return tensors


def _stream(
    units: list[Unit], streamer: Streamer, threads: int, rows: list[Row], total: int
) -> Iterator[HealthProgress | list[Row]]:
    """Run the jobs (alone or in stripes) on `threads` workers: each finished unit's rows (also gathered
    into `rows`) and progress (of `total` bytes) at most every _INTERVAL seconds; a worker's error is raised
    here."""
    count = sum(len(jobs_of(u)) for u in units)
    last, done = 0.0, 0
    for item in run_jobs(units, streamer, threads):
        if item is not None:
            unit, result = item
            if isinstance(result, BaseException):
                raise result
            rows.extend(result)
            done += len(jobs_of(unit))
            yield result
        now = time.monotonic()
        if now - last >= _INTERVAL:
            last = now
            yield HealthProgress(streamer.done_bytes, total, done, count)


def _findings(
    ckpt: Checkpoint, against: Checkpoint | None, rows: list[Row], jobs: list[Job]
) -> list[HealthFinding]:
    """The scan's errors first, then what the numbers show; with `against`, the masters it lacks or holds
    in another shape."""
    steps = Steps(ckpt.global_steps, ckpt.optimizer_step)
    then = Steps(against.global_steps, against.optimizer_step) if against else Steps()
    found = _scan_errors(ckpt) + findings(_placed(ckpt, rows), against_label(ckpt, against), steps, then)
    if against is None:
        return found
    lacking = [j for j in jobs if j.source == "master" and not j.against]
    changed = [
        (j.name, tuple(j.shape), there)
        for j in lacking
        if (there := _shape_in(against, j.name)) not in (None, tuple(j.shape))
    ]
    found += shape_changed(changed, against.tag)
    reshaped = {c[0] for c in changed}
    return found + missing_in_against([j.name for j in lacking if j.name not in reshaped], against.tag)


def _placed(ckpt: Checkpoint, rows: list[Row]) -> list[Row]:
    """Rows that say where a tensor's master lives when the name does not (a pipeline stage, which the scan
    records: layer numbers alone do not tell which stage's files, and so which ranks, to look at)."""
    stages = {t.name: t.stage for t in ckpt.tensors if t.stage is not None}
    return [replace(r, where=f"pipeline stage {stages[r.name]}") if r.name in stages else r for r in rows]


def _shape_in(ckpt: Checkpoint, name: str) -> tuple[int, ...] | None:
    try:
        return tuple(ckpt.tensor(name).shape)
    except KeyError:
        return None


def _scan_errors(ckpt: Checkpoint) -> list[HealthFinding]:
    """The scan's own error findings (damaged files) come first: the numbers below them may be partial."""
    return [
        HealthFinding(Severity.ERROR, f"scan-{f.code}", f.message, f.hint)
        for f in ckpt.findings
        if f.severity is Severity.ERROR
    ]


def run_check(ckpt: Checkpoint, against: Checkpoint | None = None, **kw: object) -> HealthReport:
    """The whole pass without progress (scripts, tests)."""
    report = None
    for item in check(ckpt, against, **kw):  # type: ignore[arg-type]
        if isinstance(item, HealthReport):
            report = item
    assert report is not None
    return report


__all__ = ["check", "run_check"]
