"""`convert`, `verify` and `preflight` commands: the rich face of plan / stream / verify / preflight.

In a terminal a live bar shows bytes, throughput, ETA and a memory line; in CI logs (no TTY) a plain line is
printed every few seconds instead.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections.abc import Callable
from typing import Any

from rich.markup import escape

from inspector.errors import InspectorError

_LOG_INTERVAL = 5.0


def _opts(args: argparse.Namespace) -> Any:
    from inspector.convert.plan import ConvertOptions
    from inspector.system.units import parse_size

    try:
        shard = parse_size(args.shard_size)
    except ValueError as exc:
        raise InspectorError(
            str(exc), hint="Use sizes like 5GB, 500MB or 2GiB.", title="Invalid option"
        ) from None
    renames = []
    for r in args.rename or []:
        if "=" not in r:
            raise InspectorError(f"--rename {r!r} needs the form REGEX=REPLACEMENT.", title="Invalid option")
        pat, _, repl = r.partition("=")
        renames.append((pat, repl))
    return ConvertOptions(
        dtype=args.dtype,
        shard_size=shard,
        include=tuple(args.include or ()),
        exclude=tuple(args.exclude or ()),
        strip_prefix=tuple(args.strip_prefix or ()),
        renames=tuple(renames),
        keep_fp32=tuple(args.keep_fp32 or ()),
        exclude_frozen=args.exclude_frozen,
        exclude_buffers=args.exclude_buffers,
        dedupe_tied=args.dedupe_tied,
    )


def add_convert_options(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--dtype",
        default="auto",
        help="output dtype for floating tensors: fp32, bf16, fp16, or "
        "auto (the training compute dtype; default). Integer buffers keep their dtype.",
    )
    p.add_argument("--shard-size", default="5GB", help="maximum shard size (default 5GB, HF naming)")
    p.add_argument(
        "--include",
        action="append",
        metavar="GLOB",
        help="only tensors matching a glob or module "
        "prefix (repeatable), e.g. 'model.layers.0' or '*.q_proj.*'",
    )
    p.add_argument(
        "--exclude", action="append", metavar="GLOB", help="leave out matching tensors (repeatable)"
    )
    p.add_argument(
        "--strip-prefix",
        action="append",
        metavar="PREFIX",
        help="remove a name prefix such as 'module.' or '_forward_module.' (repeatable)",
    )
    p.add_argument(
        "--rename",
        action="append",
        metavar="REGEX=REPL",
        help="regex rename applied after --strip-prefix (repeatable)",
    )
    p.add_argument(
        "--keep-fp32", action="append", metavar="GLOB", help="keep matching tensors in fp32, e.g. '*norm*'"
    )
    p.add_argument("--exclude-frozen", action="store_true", help="leave out frozen parameters")
    p.add_argument("--exclude-buffers", action="store_true", help="leave out buffers")
    p.add_argument(
        "--dedupe-tied",
        action="store_true",
        help="store tied weights once; the alias is recorded in the header metadata",
    )


def _progress_line(ev: Any, mem: str) -> str:
    from inspector.system.units import format_bytes

    eta = (ev.bytes_total - ev.bytes_done) / ev.throughput if ev.throughput > 0 else 0.0
    return (
        f"[{ev.fraction * 100:5.1f}%] {format_bytes(ev.bytes_done)} / {format_bytes(ev.bytes_total)}  "
        f"{format_bytes(ev.throughput)}/s  ETA {eta:.0f}s  shard {ev.shard_index + 1}/{ev.shards}  {mem}"
    )


def _memory_line() -> str:
    import psutil

    from inspector.system.rss import current_rss, peak_rss
    from inspector.system.units import format_bytes

    return (
        f"RSS {format_bytes(current_rss())} (peak {format_bytes(peak_rss())}), "
        f"available {format_bytes(psutil.virtual_memory().available)}"
    )


def cmd_convert(args: argparse.Namespace) -> int:
    if getattr(args, "format", "safetensors") == "universal":
        from inspector.cli.universal import convert_universal

        return convert_universal(args)
    from inspector.cli.console import console as _console
    from inspector.cli.render import print_assessment
    from inspector.convert.engine import Report, prepare_output, run
    from inspector.convert.plan import build_plan
    from inspector.convert.preflight import assess
    from inspector.scan.scanner import scan

    console = _console()
    ckpt = scan(args.path, args.tag)
    plan = build_plan(ckpt, _opts(args), allow_damaged=args.force)
    out_dir = os.path.abspath(args.out)
    prepare_output(plan, out_dir, args.overwrite)  # refuse a busy folder before predicting or printing
    verdict = assess(plan, out_dir)
    if not verdict.fits:
        print_assessment(console, verdict, plan)
        if not args.force:
            from inspector.errors import DoesNotFitError

            raise DoesNotFitError(verdict.problem, hint=verdict.advice)
        console.print("[yellow]--force given: starting anyway.[/]")
    console.print(
        f"Converting [bold]{escape(ckpt.root)}[/] ({escape(ckpt.tag)}, ZeRO-{ckpt.stage}, {ckpt.world_size} ranks) → "
        f"[bold]{escape(out_dir)}[/]: {plan.tensor_count} tensors, {len(plan.shards)} file(s), "
        f"{_size(plan.output_bytes)}"
    )
    report = _drive(
        console, run(plan, out_dir, overwrite=args.overwrite, fsync=args.fsync), plan.output_bytes
    )
    assert isinstance(report, Report)
    _print_report(console, report, plan)
    return 0


def _size(n: int) -> str:
    from inspector.system.units import format_bytes

    return format_bytes(n)


def _drive(console: Any, events: Any, total: int) -> Any:
    """Consume run() events with a live bar (terminal) or periodic log lines (CI)."""
    from inspector.convert.engine import Progress, Report

    if not console.is_terminal:
        last = 0.0
        for ev in events:
            if isinstance(ev, Report):
                return ev
            if isinstance(ev, Progress) and time.monotonic() - last >= _LOG_INTERVAL:
                last = time.monotonic()
                console.print(_progress_line(ev, _memory_line()), soft_wrap=True)
        return None
    from rich.progress import BarColumn, DownloadColumn, TextColumn, TimeRemainingColumn, TransferSpeedColumn
    from rich.progress import Progress as Bar

    with Bar(
        TextColumn("{task.description}"),
        BarColumn(),
        DownloadColumn(binary_units=True),
        TransferSpeedColumn(),
        TimeRemainingColumn(),
        TextColumn("{task.fields[mem]}"),
        console=console,
        transient=False,
    ) as bar:
        task = bar.add_task("converting", total=total, mem="")
        for ev in events:
            if isinstance(ev, Report):
                bar.refresh()
                return ev
            if isinstance(ev, Progress):
                bar.update(
                    task,
                    completed=ev.bytes_done,
                    total=ev.bytes_total,
                    description=f"shard {ev.shard_index + 1}/{ev.shards}",
                    mem=_memory_line(),
                )
    return None


def _print_report(console: Any, report: Any, plan: Any) -> None:
    from rich.table import Table

    from inspector.system.rss import peak_rss

    t = Table(title="Written", title_justify="left", show_edge=False)
    t.add_column("file")
    t.add_column("size", justify="right")
    for name, size in report.files:
        t.add_row(name, _size(size))
    console.print(t)
    rate = report.bytes_written / report.seconds if report.seconds else 0.0
    resumed = (
        f", {report.resumed_shards} shard(s) reused from an interrupted run" if report.resumed_shards else ""
    )
    console.print(
        f"[green]Done[/] in {report.seconds:.1f} s: {report.tensors} tensors, "
        f"{_size(report.bytes_written)} at {_size(int(rate))}/s, peak RSS {_size(peak_rss())}{resumed}."
    )
    if plan.aliases:
        console.print(
            escape(f"Tied weights stored once: {', '.join(f'{a} → {o}' for a, o in plan.aliases.items())}.")
        )
    if report.removed_stale:
        console.print(
            escape(f"Removed stale files from an earlier conversion: {', '.join(report.removed_stale)}.")
        )


def cmd_verify(args: argparse.Namespace) -> int:
    from inspector.scan.universal import find_universal

    if (uni := find_universal(args.out, prefer=True)) is not None:
        from inspector.cli.universal import verify_universal_cli

        return verify_universal_cli(args, uni)
    from inspector.cli.console import console as _console
    from inspector.convert.verify import VerifyResult, run_verify
    from inspector.scan.scanner import scan

    console = _console()
    ckpt = scan(args.path, args.tag)
    result = None
    start = time.monotonic()
    with console.status("Verifying…") as status:
        last = 0.0
        for ev in run_verify(ckpt, os.path.abspath(args.out)):
            if isinstance(ev, VerifyResult):
                result = ev
            elif time.monotonic() - last > 0.25:
                last = time.monotonic()
                status.update(f"Verifying {ev.tensor} ({ev.bytes_done * 100 // max(ev.bytes_total, 1)}%)…")
    assert result is not None
    secs = time.monotonic() - start
    for note in result.notes:
        console.print(f"[dim]{escape(note)}[/]")
    for label, names in (
        ("Mismatched", result.mismatched),
        ("Unexpected (not in the checkpoint)", result.unexpected),
        ("Missing from the output", result.missing),
    ):
        if names:
            console.print(
                f"[bold red]{label}[/] ({len(names)}): "
                + escape(", ".join(names[:20]))
                + (" …" if len(names) > 20 else "")
            )
    if result.ok:
        console.print(
            f"[green]OK[/]: {result.checked} tensors, {_size(result.bytes_checked)} identical to the "
            f"checkpoint after conversion ({secs:.1f} s)."
        )
        return 0
    console.print("[bold red]Verification failed.[/]")
    return 1


def cmd_preflight(args: argparse.Namespace) -> int:
    if getattr(args, "format", "safetensors") == "universal":
        from inspector.cli.universal import preflight_universal_cli

        return preflight_universal_cli(args)
    from inspector.cli.console import console as _console
    from inspector.cli.render import print_assessment
    from inspector.convert.plan import build_plan
    from inspector.convert.preflight import assess, assessment_json
    from inspector.errors import EXIT_DOES_NOT_FIT
    from inspector.scan.scanner import scan

    ckpt = scan(args.path, args.tag)
    plan = build_plan(ckpt, _opts(args), allow_damaged=True)
    verdict = assess(plan, os.path.abspath(args.out or os.getcwd()))
    if args.json:
        print(json.dumps(assessment_json(verdict, plan), indent=1))
    else:
        print_assessment(_console(), verdict, plan)
    return 0 if verdict.fits else EXIT_DOES_NOT_FIT


def register(sub: Any, add_common: Callable[[argparse.ArgumentParser], None]) -> None:
    p = sub.add_parser("convert", help="stream a checkpoint into safetensors shards with flat memory")
    add_common(p)
    p.add_argument("out", help="output folder (must be empty, or pass --overwrite)")
    p.add_argument(
        "--format",
        choices=("safetensors", "universal"),
        default="safetensors",
        help="universal: a DeepSpeed universal checkpoint in OUT/<tag>_uni plus OUT/latest_universal "
        "(resume on any world size with load_universal; OUT may be the checkpoint root)",
    )
    add_convert_options(p)
    p.add_argument("--overwrite", action="store_true", help="replace model*.safetensors and the index in OUT")
    p.add_argument(
        "--fsync",
        action="store_true",
        help="flush every file to disk before renaming it (survives a power cut; slower). A killed run "
        "never leaves complete-looking files either way",
    )
    p.add_argument(
        "--force",
        action="store_true",
        help="start even if preflight says it will not fit, or the checkpoint has error findings",
    )
    p.set_defaults(func=cmd_convert)

    p = sub.add_parser("verify", help="check converted safetensors byte for byte against the checkpoint")
    add_common(p)
    p.add_argument("out", help="folder written by convert")
    p.set_defaults(func=cmd_verify)

    p = sub.add_parser("preflight", help="predict peak RAM, disk and time of a conversion before running it")
    add_common(p)
    p.add_argument("--out", help="where the output would go (for free disk; default: current folder)")
    p.add_argument("--format", choices=("safetensors", "universal"), default="safetensors")
    add_convert_options(p)
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=cmd_preflight)
