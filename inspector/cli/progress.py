"""`--progress json`: convert and verify as JSON lines on stdout, for a front end that runs them as a child.

One object per line, flushed: `start`, then `progress` (<= 4/s: bytes done/total, tensor, shard and its own
bytes, throughput), then `report` (convert) or `verified` (verify); on a user error an `error` line
(title, message, hint, exit_code) before the usual stderr message and exit code. SIGTERM is handled like
Ctrl-C, so either signal removes the partial output before the process exits 130.
"""

from __future__ import annotations

import argparse
import signal
import sys
import time
from collections.abc import Callable, Iterable
from typing import Any, NoReturn

from inspector.convert.events import (
    Cancelled,
    Event,
    Failed,
    Finished,
    Progressed,
    Started,
    Verified,
    to_line,
)
from inspector.errors import InspectorError


def emit(event: Event) -> None:
    """One event, one line, flushed (the types are the reader's too: convert/events.py)."""
    sys.stdout.write(to_line(event) + "\n")
    sys.stdout.flush()


def _interrupt(signum: int, frame: Any) -> NoReturn:
    raise KeyboardInterrupt


def _guard(body: Callable[[], int]) -> int:
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        return body()
    except InspectorError as exc:
        emit(Failed(title=exc.title, message=exc.message, hint=exc.hint, exit_code=exc.exit_code))
        raise
    except KeyboardInterrupt:
        emit(Cancelled())
        raise


def convert_json(args: argparse.Namespace) -> int:
    """`convert ... --progress json`: the same checks as the rich command, events instead of a bar; the same
    events for every output kind."""

    def body() -> int:
        from inspector.cli.jobs import job_events, planned_order
        from inspector.convert.executor import Progress, Report
        from inspector.errors import DoesNotFitError

        _, job, order = planned_order(args)  # --executor ray's options: checked by cmd_convert
        job.check_output(order.overwrite)
        verdict = job.assess()
        if not verdict.fits and not order.request.allow_damaged:
            raise DoesNotFitError(verdict.problem, hint=verdict.advice)
        emit(_started(job, verdict))
        files = job.files
        starts, pos = [], 0
        for f in files:
            starts.append(pos)
            pos += f.nbytes
        for ev in job_events(order, job, []):
            if isinstance(ev, Progress):
                emit(_progressed(ev, files, starts))
            elif isinstance(ev, Report):
                emit(finished(ev, job))
        return 0

    return _guard(body)


def _started(job: Any, verdict: Any) -> Started:
    """The `start` line: the plan the child runs, which the app checks against the one it showed."""
    return Started(
        out_dir=job.where,
        kind=job.kind,
        tensors=job.tensor_count,
        output_bytes=job.output_bytes,
        files=[[f.name, f.nbytes] for f in job.files],
        uses_selection=job.uses_selection,
        keeps_on_cancel=job.keeps_on_cancel,
        predicted_peak_rss=verdict.predicted_peak_rss,
        plan=job.identity,
    )


def _progressed(ev: Any, files: Any, starts: list[int]) -> Progressed:
    """A `progress` line; the file's own bytes where the event counts the listed files (`starts`: where
    each file begins in the run's bytes)."""
    i = min(ev.shard_index, len(files) - 1)
    one = ev.shards == len(files) and files  # the event counts the listed files
    return Progressed(
        bytes_done=ev.bytes_done,
        bytes_total=ev.bytes_total,
        tensor=ev.tensor,
        file=ev.shard,
        file_index=ev.shard_index,
        files=ev.shards,
        files_done=ev.files_done,
        file_done=min(max(ev.bytes_done - starts[i], 0), files[i].nbytes) if one else ev.bytes_done,
        file_total=files[i].nbytes if one else ev.bytes_total,
        elapsed=round(ev.elapsed, 3),
        throughput=round(ev.throughput, 1),
    )


def finished(ev: Any, job: Any) -> Finished:
    """The `report` line of a finished run."""
    from inspector.system.rss import peak_rss

    return Finished(
        out_dir=ev.out_dir,
        files=[list(f) for f in ev.files],
        tensors=ev.tensors,
        bytes_written=ev.bytes_written,
        seconds=round(ev.seconds, 3),
        resumed_files=ev.resumed_shards,
        removed_stale=list(ev.removed_stale),
        peak_rss=peak_rss(),
        words=job.finished_words(ev),
    )


def verify_json(args: argparse.Namespace) -> int:
    """`verify ... --progress json`, for every output kind."""

    def body() -> int:
        from inspector.cli.jobs import byte_sources, verify_job, verify_options
        from inspector.convert.verify import VerifyResult

        kind, ckpt, out = verify_job(args)
        trusted = byte_sources(ckpt.root, out)
        return _stream_verify(kind.verify(ckpt, out, **verify_options(kind, args)), VerifyResult, trusted)

    return _guard(body)


def verified(result: Any, trusted: list[str], seconds: float) -> Verified:
    """A verify run's result: the `verified` line, and `verify --json`'s object."""
    return Verified(
        ok=result.ok,
        checked=result.checked,
        bytes_checked=result.bytes_checked,
        mismatched=result.mismatched,
        missing=result.missing,
        unexpected=result.unexpected,
        notes=[*result.notes, *trusted],
        seconds=round(seconds, 3),
    )


def _stream_verify(events: Iterable[Any], result_type: type[Any], trusted: list[str]) -> int:
    """A verify run's events as JSON lines: `progress` at most every 0.25 s, then `verified`; the exit code."""
    start = last = time.monotonic()
    for ev in events:
        now = time.monotonic()
        if isinstance(ev, result_type):
            emit(verified(ev, trusted, now - start))
            return 0 if ev.ok else 1
        if now - last >= 0.25:
            last = now
            elapsed = now - start
            emit(
                Progressed(
                    bytes_done=ev.bytes_done,
                    bytes_total=ev.bytes_total,
                    tensor=ev.tensor,
                    elapsed=round(elapsed, 3),
                    throughput=round(ev.bytes_done / elapsed, 1) if elapsed else 0.0,
                )
            )
    return 1
