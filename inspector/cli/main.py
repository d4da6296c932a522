"""Command line: scan, demo, convert, verify, preflight. User errors print a clear message, never a traceback.

Exit codes: 0 ok; 1 the checkpoint or output has errors (findings, verify mismatches); 2 bad input or usage;
3 preflight says the job does not fit; 130 cancelled.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
from collections.abc import Sequence

from inspector import __version__
from inspector.cli.console import console as _console
from inspector.cli.console import print_error as _print_error
from inspector.cli.console import stdout_closed
from inspector.errors import EXIT_CANCELLED, EXIT_DAMAGED, EXIT_OK, EXIT_USAGE, InspectorError


def cmd_scan(args: argparse.Namespace) -> int:
    from inspector.scan.scanner import scan

    ckpt = scan(args.path, args.tag)
    rc = EXIT_DAMAGED if ckpt.errors else EXIT_OK
    try:
        if args.json:
            from inspector.scan.summary import checkpoint_json

            print(json.dumps(checkpoint_json(ckpt), indent=1), flush=True)
        else:
            from inspector.cli.render import print_scan

            print_scan(_console(), ckpt, all_tensors=args.tensors)
    except BrokenPipeError:  # the reader stopped early (`| head`): the verdict is still the checkpoint's
        stdout_closed()
    return rc


def cmd_demo(args: argparse.Namespace) -> int:
    from inspector.demo.writer import DemoSpec, write_demo
    from inspector.system.units import parse_size

    out = os.path.abspath(args.dir)
    if os.path.exists(out) and os.listdir(out) and not args.overwrite:
        raise InspectorError(
            f"{out} is not empty.",
            hint="Choose a new folder, or pass --overwrite.",
            title="Output folder not empty",
        )
    spec = DemoSpec(
        stage=args.stage,
        world_size=args.world_size,
        dtype=args.dtype,
        params=parse_size(args.params),
        frozen=not args.no_frozen,
        tied=not args.no_tied,
        bf16_optimizer=args.bf16_optimizer,
        sub_group_size=args.sub_group_size,
    )
    try:
        from inspector.demo.writer import architecture

        params, tied = architecture(spec)
        n = sum(p.numel for p in params if p.kind != "buffer" and p.name not in tied)
        console = _console()
        with console.status(
            f"Writing a {n:,}-parameter ZeRO-{spec.stage} checkpoint ({spec.world_size} ranks, {spec.dtype})…"
        ) as status:
            tag_dir = write_demo(out, spec, progress=lambda f: status.update(f"Writing {f}…"))
    except ValueError as exc:
        raise InspectorError(str(exc), title="Invalid demo options") from None
    console.print(f"Wrote [bold]{tag_dir}[/] ({n:,} parameters). Try: [bold]zero-inspector scan {out}[/]")
    return EXIT_OK


def _add_common(p: argparse.ArgumentParser) -> None:
    p.add_argument("path", help="checkpoint root (with `latest`), tag folder, Trainer run or Lightning .ckpt")
    p.add_argument("--tag", help="tag to read (default: the one named in `latest`)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="zero-inspector",
        description="Inspect DeepSpeed ZeRO checkpoints and convert them to safetensors with flat memory. "
        "No deepspeed needed; no pickled code is ever run.",
    )
    parser.add_argument("--version", action="version", version=f"zero-inspector {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    p = sub.add_parser("scan", help="show what a checkpoint holds and check it for damage")
    _add_common(p)
    p.add_argument("--json", action="store_true", help="print one JSON object instead of tables")
    p.add_argument("--tensors", action="store_true", help="list every tensor instead of grouping by module")
    p.set_defaults(func=cmd_scan)

    p = sub.add_parser("demo", help="write a realistic demo checkpoint (real DeepSpeed layout)")
    p.add_argument("dir")
    p.add_argument("--stage", type=int, choices=(1, 2, 3), default=2)
    p.add_argument("--world-size", type=int, default=2)
    p.add_argument("--dtype", choices=("bf16", "fp16", "fp32"), default="bf16")
    p.add_argument("--params", default="2M", help="approximate parameter count, e.g. 2M, 500M, 1.5G")
    p.add_argument("--sub-group-size", type=int, default=1_000_000_000, help="stage 3 sub-group size")
    p.add_argument("--bf16-optimizer", action="store_true", help="stage 1 BF16_Optimizer layout")
    p.add_argument("--no-frozen", action="store_true")
    p.add_argument("--no-tied", action="store_true")
    p.add_argument("--overwrite", action="store_true")
    p.set_defaults(func=cmd_demo)

    from inspector.cli import convert as cli_convert

    cli_convert.register(sub, _add_common)
    return parser


def _terminate(signum: int, frame: object) -> None:
    raise KeyboardInterrupt  # SIGTERM (schedulers, `timeout`) cleans up exactly like Ctrl-C


def main(argv: Sequence[str] | None = None) -> int:
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _terminate)
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "command", None):
        parser.print_help()
        return EXIT_USAGE
    try:
        return int(args.func(args))
    except InspectorError as exc:
        _print_error(exc)
        return exc.exit_code
    except KeyboardInterrupt:
        _console(stderr=True).print("[yellow]Interrupted; partial output (if any) was removed.[/]")
        return EXIT_CANCELLED
    except BrokenPipeError:  # stdout closed by its reader while a command printed: not a failure
        stdout_closed()
        return EXIT_OK


def entry() -> None:
    sys.exit(main())
