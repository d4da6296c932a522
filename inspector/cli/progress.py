"""`--progress json`: convert and verify as JSON lines on stdout, for a front end that runs them as a child.

One object per line, flushed: `start`, then `progress` (<= 4/s: bytes done/total, tensor, shard and its own
bytes, throughput), then `report` (convert) or `verified` (verify); on a user error an `error` line
(title, message, hint, exit_code) before the usual stderr message and exit code. SIGTERM is handled like
Ctrl-C, so either signal removes the partial output before the process exits 130.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from collections.abc import Callable, Iterable
from typing import Any, NoReturn

from inspector.errors import InspectorError


def emit(event: str, **fields: Any) -> None:
    sys.stdout.write(json.dumps({"event": event, **fields}) + "\n")
    sys.stdout.flush()


def _interrupt(signum: int, frame: Any) -> NoReturn:
    raise KeyboardInterrupt


def _guard(body: Callable[[], int]) -> int:
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        return body()
    except InspectorError as exc:
        emit("error", title=exc.title, message=exc.message, hint=exc.hint, exit_code=exc.exit_code)
        raise
    except KeyboardInterrupt:
        emit("cancelled")
        raise


def convert_json(args: argparse.Namespace, export_plan: Callable[[Any], Any]) -> int:
    """`convert ... --progress json`: the same checks as the rich command, events instead of a bar."""

    def body() -> int:
        from inspector.scan.scanner import scan

        ckpt = scan(args.path, args.tag)  # a bad path fails here, before the converter loads
        xp = export_plan(ckpt)
        plan = xp.plan
        from inspector.convert.engine import Progress, Report
        from inspector.convert.export import run_export
        from inspector.convert.output import prepare_output
        from inspector.convert.preflight import assess
        from inspector.errors import DoesNotFitError
        from inspector.system.rss import peak_rss

        out_dir = os.path.abspath(args.out)
        prepare_output(plan, out_dir, args.overwrite)
        verdict = assess(
            plan,
            out_dir,
            extra_output_bytes=xp.output_bytes - plan.output_bytes,
            extra_memory=xp.extra_memory,
        )
        if not verdict.fits and not args.force:
            raise DoesNotFitError(verdict.problem, hint=verdict.advice)
        starts, pos = [], 0
        for s in plan.shards:
            starts.append(pos)
            pos += s.file_bytes
        emit(
            "start",
            out_dir=out_dir,
            kind=str(xp.kind),
            tensors=plan.tensor_count,
            output_bytes=xp.output_bytes,
            shards=[[s.filename, s.file_bytes] for s in plan.shards],
            predicted_peak_rss=verdict.predicted_peak_rss,
        )
        for ev in run_export(xp, out_dir, overwrite=args.overwrite, fsync=args.fsync):
            if isinstance(ev, Progress):
                i = min(ev.shard_index, len(plan.shards) - 1)
                shard_total = plan.shards[i].file_bytes
                emit(
                    "progress",
                    bytes_done=ev.bytes_done,
                    bytes_total=ev.bytes_total,
                    tensor=ev.tensor,
                    shard=ev.shard,
                    shard_index=i,
                    shards=ev.shards,
                    shard_done=min(max(ev.bytes_done - starts[i], 0), shard_total),
                    shard_total=shard_total,
                    elapsed=round(ev.elapsed, 3),
                    throughput=round(ev.throughput, 1),
                )
            elif isinstance(ev, Report):
                emit(
                    "report",
                    out_dir=ev.out_dir,
                    files=[list(f) for f in ev.files],
                    tensors=ev.tensors,
                    bytes_written=ev.bytes_written,
                    seconds=round(ev.seconds, 3),
                    resumed_shards=ev.resumed_shards,
                    removed_stale=list(ev.removed_stale),
                    peak_rss=peak_rss(),
                )
        return 0

    return _guard(body)


def verify_json(args: argparse.Namespace) -> int:
    """`verify ... --progress json`."""

    def body() -> int:
        from inspector.convert.verify import VerifyResult, recorded_tag, run_verify
        from inspector.scan.scanner import scan

        ckpt = scan(args.path, args.tag or recorded_tag(os.path.abspath(args.out)))
        return _stream_verify(
            run_verify(ckpt, os.path.abspath(args.out), against=args.against), VerifyResult
        )

    return _guard(body)


def convert_universal_json(args: argparse.Namespace) -> int:
    """`convert --format universal --progress json`: the writer's byte count as `progress` events."""

    def body() -> int:
        import threading

        from inspector.cli.universal import checked_plan
        from inspector.convert.writers.universal import write_universal
        from inspector.convert.writers.universal_preflight import estimate_universal
        from inspector.errors import DoesNotFitError
        from inspector.system.rss import peak_rss

        ckpt, plan = checked_plan(args)
        rank0 = ckpt.ranks[0].optim_bytes if ckpt.stage == 3 and ckpt.ranks else 0
        est = estimate_universal(plan, stage3_rank0_optim=rank0)
        if not est.fits and not args.force:
            raise DoesNotFitError(
                "The universal checkpoint does not fit in memory or on disk.",
                hint="See `zero-inspector preflight --format universal`; --force starts it anyway.",
            )
        total = plan.total_bytes
        emit(
            "start",
            out_dir=plan.out_dir,
            kind="universal",
            tensors=len(plan.files),
            output_bytes=total,
            shards=[],
            predicted_peak_rss=est.predicted_peak_rss,
        )
        done = [0]
        lock = threading.Lock()

        def progress(n: int) -> None:
            with lock:
                done[0] += n

        result: list[Any] = []
        error: list[BaseException] = []
        cancel = threading.Event()
        finished = threading.Event()

        def work() -> None:
            try:
                result.append(
                    write_universal(plan, overwrite=args.overwrite, cancel=cancel, progress=progress)
                )
            except BaseException as exc:
                error.append(exc)
            finally:
                finished.set()

        start = time.monotonic()
        threading.Thread(target=work, name="zi-universal", daemon=True).start()
        try:
            while not finished.wait(0.25):
                elapsed = time.monotonic() - start
                emit(
                    "progress",
                    bytes_done=done[0],
                    bytes_total=total,
                    tensor="",
                    elapsed=round(elapsed, 3),
                    throughput=round(done[0] / elapsed, 1) if elapsed else 0.0,
                )
        except KeyboardInterrupt:  # SIGINT / SIGTERM: finished files stay in <tag>_uni.partial/ for a rerun
            cancel.set()
            finished.wait()
            raise
        if error:
            raise error[0]
        report = result[0]
        emit(
            "report",
            out_dir=plan.out_dir,
            files=[[plan.folder, report.bytes_written]],
            tensors=report.files,
            bytes_written=report.bytes_written,
            seconds=round(time.monotonic() - start, 3),
            resumed_shards=report.reused,
            removed_stale=[],
            peak_rss=peak_rss(),
        )
        return 0

    return _guard(body)


def verify_universal_json(args: argparse.Namespace, folder: str) -> int:
    """`verify OUT --progress json` where OUT holds a universal checkpoint."""

    def body() -> int:
        from inspector.convert.writers.universal_verify import UniversalVerifyResult, verify_universal
        from inspector.scan.scanner import scan
        from inspector.scan.universal import scan_universal

        src = scan(args.path, args.tag)
        uni = scan_universal(folder)
        return _stream_verify(verify_universal(src, uni), UniversalVerifyResult)

    return _guard(body)


def _stream_verify(events: Iterable[Any], result_type: type[Any]) -> int:
    """A verify run's events as JSON lines: `progress` at most every 0.25 s, then `verified`; the exit code."""
    start = last = time.monotonic()
    for ev in events:
        now = time.monotonic()
        if isinstance(ev, result_type):
            emit(
                "verified",
                ok=ev.ok,
                checked=ev.checked,
                bytes_checked=ev.bytes_checked,
                mismatched=ev.mismatched,
                missing=ev.missing,
                unexpected=ev.unexpected,
                notes=ev.notes,
                seconds=round(now - start, 3),
            )
            return 0 if ev.ok else 1
        if now - last >= 0.25:
            last = now
            elapsed = now - start
            emit(
                "progress",
                bytes_done=ev.bytes_done,
                bytes_total=ev.bytes_total,
                tensor=ev.tensor,
                elapsed=round(elapsed, 3),
                throughput=round(ev.bytes_done / elapsed, 1) if elapsed else 0.0,
            )
    return 1
