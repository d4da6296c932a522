"""`convert`, `verify` and `preflight` commands: the rich face of the output kinds (`convert.kinds`).

Each command picks a kind from the registry by name and talks to it through the protocol: plan a Job, check
the output folder, assess, run (Progress events, then a Report), verify. Nothing here depends on which kind it
is. In a terminal a live bar shows bytes, throughput, ETA and a memory line; in CI logs (no TTY) a plain line
is printed every few seconds instead.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import Any

from inspector.cli.console import literal as escape
from inspector.cli.console import print_json
from inspector.cli.options import add_convert_options, format_help
from inspector.cli.parser import add_command
from inspector.system.units import format_bytes, plural


def cmd_convert(args: argparse.Namespace) -> int:
    started = time.monotonic()
    from inspector.cli.jobs import job_events, planned_order, ray_options
    from inspector.cli.live import drive, print_report, print_tasks

    ray_options(args)
    _one_json_kind(args)
    if args.progress == "json":  # for a front end running us as a child (the TUI)
        from inspector.cli.progress import convert_json

        return convert_json(args)
    from inspector.cli.console import console as _console
    from inspector.cli.render import print_assessment
    from inspector.convert.executor import Report

    console = _console(stderr=args.json)  # --json: stdout holds the one summary object, people read stderr
    ckpt, job, order = planned_order(args)  # one scan, --selection resolved in it
    part = order.part
    job.check_output(order.overwrite)  # a busy folder: refused before any figure
    verdict = job.assess()
    if not verdict.fits:
        forced = order.request.allow_damaged
        print_assessment(console, verdict, job, verdict=forced)  # the figures; the error says why
        if not forced:
            from inspector.errors import DoesNotFitError

            raise DoesNotFitError(verdict.problem, hint=verdict.advice)
        console.print("[yellow]--force given: starting anyway.[/]")
    _announce(console, ckpt, job, args.force)
    tasks: list[Any] = []
    events: Any = None
    try:
        events = job_events(order, job, tasks)
        report = drive(console, events, job.output_bytes, unit="part" if args.executor == "ray" else "file")
        if tasks:
            print_tasks(console, tasks)
    except KeyboardInterrupt:  # Ctrl-C, or SIGTERM (cli.main turns it into KeyboardInterrupt)
        from inspector.errors import CancelledError

        if events is not None and hasattr(events, "close"):  # its cleanup now (partial files, open uploads)
            events.close()
        words = job.cancelled_words()
        raise CancelledError(f"Interrupted; {words}.") from None
    if not isinstance(report, Report):  # run() raises on cancel and errors; this is our bug, not the user's
        raise RuntimeError("the conversion ended without a report")
    print_report(console, report, job, part, total=time.monotonic() - started)
    if args.json:
        from dataclasses import asdict

        from inspector.cli.progress import finished

        print_json(asdict(finished(report, job)))
    return 0


def _announce(console: Any, ckpt: Any, job: Any, force: bool) -> None:
    """What is about to be converted into what, the kind's notes, and what --force leaves out (said before
    it is left out)."""
    console.print(
        f"Converting [bold]{escape(ckpt.root)}[/] ({escape(ckpt.tag)}, ZeRO-{ckpt.stage}, {plural(ckpt.world_size, 'rank')}) → "
        f"[bold]{escape(job.where)}[/] ({job.kind}): {job.tensor_count} tensors, "
        f"{plural(len(job.files), 'file')}, {format_bytes(job.output_bytes)}"
    )
    for note in job.notes:
        console.print(f"[dim]{escape(note, newlines=True)}[/]")
    for error in ckpt.errors if force else ():
        console.print(f"[yellow]--force: {escape(error.message)}[/]")


def cmd_verify(args: argparse.Namespace) -> int:
    from inspector.cli.jobs import byte_sources, verify_job, verify_options

    _one_json_kind(args)
    if args.progress == "json":
        from inspector.cli.progress import verify_json

        return verify_json(args)
    from inspector.cli.console import console as _console
    from inspector.cli.live import duration
    from inspector.convert.verify import VerifyResult

    console = _console(stderr=args.json)  # --json: stdout holds the one result object
    kind, ckpt, out = verify_job(args)
    result = None
    start = time.monotonic()
    with console.status("Verifying…") as status:
        last = 0.0
        for ev in kind.verify(ckpt, out, **verify_options(kind, args)):
            if isinstance(ev, VerifyResult):
                result = ev
            elif time.monotonic() - last > 0.25:
                last = time.monotonic()
                status.update(
                    f"Verifying {escape(ev.tensor)} ({ev.bytes_done * 100 // max(ev.bytes_total, 1)}%)…"
                )
    if result is None:  # verify raises CancelledError on cancel; no result otherwise is our bug
        raise RuntimeError("verify ended without a result")
    secs = time.monotonic() - start
    trusted = byte_sources(ckpt.root, out)
    if args.json:
        from dataclasses import asdict

        from inspector.cli.progress import verified

        print_json(asdict(verified(result, trusted, secs)))
    for note in [*result.notes, *trusted]:
        console.print(f"[dim]{escape(note, newlines=True)}[/]")
    for label, names in (
        ("Mismatched", result.mismatched),
        ("Unexpected (not in the checkpoint)", result.unexpected),
        ("Missing from the output", result.missing),
        ("Unreadable source files", result.unreadable),
    ):
        if names:
            console.print(
                f"[bold red]{label}[/] ({len(names)}): "
                + escape(", ".join(names[:20]))
                + (" …" if len(names) > 20 else "")
            )
    if result.ok:
        console.print(
            f"[green]OK[/]: {kind.name} output, {result.checked} tensors, {format_bytes(result.bytes_checked)} "
            f"agree with the checkpoint ({duration(secs)})."
        )
        return 0
    console.print("[bold red]Verification failed.[/]")
    return 1


def _one_json_kind(args: argparse.Namespace) -> None:
    """`--json` (one object at the end) and `--progress json` (a stream of lines) cannot share stdout."""
    if args.json and args.progress == "json":
        from inspector.errors import InspectorError

        raise InspectorError(
            "--json and --progress json both print on stdout: one summary object, or a stream of JSON lines.",
            hint="Choose one of them.",
            title="Invalid option",
        )


def _add_progress(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--progress",
        choices=("auto", "json"),
        default="auto",
        help="json: JSON lines on stdout (start, progress, report/verified, error) for a front end",
    )


def _add_json(p: argparse.ArgumentParser, help: str) -> None:
    p.add_argument("--json", action="store_true", help=help)


def register(sub: Any, add_common: Callable[[argparse.ArgumentParser], None]) -> None:
    """`convert`, `verify` and `preflight`, each with the common path/tag options."""
    _register_convert(sub, add_common)
    _register_verify(sub, add_common)
    from inspector.cli import preflight  # its own module: a command of its own

    preflight.register(sub, add_common)


def _register_convert(sub: Any, add_common: Callable[[argparse.ArgumentParser], None]) -> None:
    add_command(
        sub,
        "convert",
        "stream a checkpoint into safetensors, a model folder or a universal checkpoint",
        lambda p: _convert_options(p, add_common),
    )


def _convert_options(
    p: argparse.ArgumentParser, add_common: Callable[[argparse.ArgumentParser], None]
) -> None:
    add_common(p)
    p.add_argument(
        "out",
        help="output folder (must be empty, or pass --overwrite), or s3://bucket/prefix: each file is "
        "uploaded as soon as it is written",
    )
    from inspector.convert.kinds import DEFAULT  # the kinds load numpy: only when convert's options are read

    p.add_argument("--format", metavar="KIND", default=DEFAULT, help=format_help())
    add_convert_options(p)
    p.add_argument("--overwrite", action="store_true", help="replace this tool's earlier output in OUT")
    p.add_argument(
        "--staging",
        metavar="DIR",
        help="with an s3:// OUT: where files wait for their upload (default: the temporary folder; it holds "
        "the largest file or, for --format universal, a few at once)",
    )
    _add_run_options(p)
    p.add_argument(
        "--force",
        action="store_true",
        help="start even if preflight says it will not fit, or the checkpoint has error findings",
    )
    _add_progress(p)
    _add_json(p, "print the summary as one JSON object on stdout (the progress and the tables go to stderr)")
    # a front end's own order as JSON on stdin (the app's child converts exactly the plan it previewed)
    p.add_argument("--order", choices=("-",), help=argparse.SUPPRESS)
    p.set_defaults(func=cmd_convert)


def _add_run_options(p: argparse.ArgumentParser) -> None:
    """How a conversion runs: a share of the files, on Ray, flushed to disk."""
    p.add_argument(
        "--part",
        metavar="I/N",
        help="write only part I of N (0 <= I < N) of the output files, for N runs side by side into one OUT "
        "(a Slurm array, a Kubernetes indexed job; OUT a shared folder or an s3:// prefix, each part then "
        "uploading its share); then run the same command without --part to finish",
    )
    p.add_argument(
        "--executor",
        choices=("local", "ray"),
        default="local",
        help="ray: run the parts as tasks on a Ray cluster (pip install 'zero-inspector[ray]'; the checkpoint "
        "and OUT on storage every node sees at the same path, or in a bucket), then finish here",
    )
    p.add_argument(
        "--ray-address",
        metavar="ADDR",
        help="the cluster to join (default: RAY_ADDRESS, else a local Ray started for this run)",
    )
    p.add_argument(
        "--parts",
        type=int,
        metavar="N",
        help="with --executor ray: how many tasks (default: one per CPU of the cluster, at most one per file)",
    )
    p.add_argument(
        "--fsync",
        action="store_true",
        help="flush every file to disk before renaming it (survives a power cut; slower). A killed run "
        "never leaves complete-looking files either way",
    )


def _register_verify(sub: Any, add_common: Callable[[argparse.ArgumentParser], None]) -> None:
    add_command(
        sub,
        "verify",
        "check an output against the checkpoint it was converted from",
        lambda p: _verify_options(p, add_common),
    )


def _verify_options(
    p: argparse.ArgumentParser, add_common: Callable[[argparse.ArgumentParser], None]
) -> None:
    add_common(p)
    for action in p._actions:  # verify reads the tag the output records, not `latest`
        if "--tag" in action.option_strings:
            action.help = "tag to check against (default: the tag the output records it came from)"
    p.add_argument("out", help="folder (or s3://bucket/prefix) written by convert")
    p.add_argument(
        "--against",
        choices=("masters", "module"),
        default=None,
        help="check against the fp32 masters or the 16-bit module copy (default: the source the output "
        "was converted from; the other one makes an independent check)",
    )
    p.add_argument(
        "--base",
        metavar="DIR",
        help="for a merged output: the base model folder it was merged into (default: as convert finds it, "
        "base_model_name_or_path in adapter_config.json); checked against the hash the output records",
    )
    _add_progress(p)
    _add_json(p, "print the result as one JSON object on stdout (the messages go to stderr)")
    p.set_defaults(func=cmd_verify)
