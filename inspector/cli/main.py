"""Command line: scan, demo, convert, verify, preflight. User errors print a clear message, never a traceback.

Exit codes: 0 ok; 1 the checkpoint or output has errors (findings, verify mismatches); 2 bad input or usage;
3 preflight says the job does not fit; 130 cancelled.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import sys
import threading
from collections.abc import Sequence
from typing import Any

from inspector import __version__
from inspector.cli.console import console as _console
from inspector.cli.console import literal as escape
from inspector.cli.console import print_error as _print_error
from inspector.cli.console import print_json, stdout_closed
from inspector.cli.launch import add_open
from inspector.cli.options import add_tp_split_option
from inspector.cli.parser import Parser, add_command, fill_all
from inspector.errors import EXIT_CANCELLED, EXIT_DAMAGED, EXIT_OK, EXIT_USAGE, InspectorError, StoreError
from inspector.system.blas import one_blas_thread
from inspector.system.descriptors import raise_descriptor_limit
from inspector.system.malloc import cap_malloc_arenas
from inspector.text import command_hint


def _with_roots_named(exc: InspectorError, path: str) -> InspectorError:
    """A folder that is not a checkpoint but holds some (a Lightning run's `last.ckpt/`, a Trainer run's
    `checkpoint-N/`): the refusal names them, as the app finds them, instead of only "no checkpoint"."""
    from inspector.remote.roots import source_at
    from inspector.scan.locate import discover_roots
    from inspector.system.units import plural

    if isinstance(exc, StoreError):  # the store refused: asking it again for a listing would only repeat that
        return exc
    roots = [r for r in discover_roots(path, source_at(path, "checkpoint")) if os.path.abspath(r) != os.path.abspath(path)]
    if not roots:
        return exc
    names = ", ".join(os.path.relpath(r, path) for r in roots[:5]) + (" …" if len(roots) > 5 else "")
    exc.hint = (
        f"It holds {plural(len(roots), 'checkpoint')}: {names}. Scan one of them, e.g. "
        f"`{command_hint('scan', roots[-1])}`, or open the folder in the app to choose."
    )
    return exc


def cmd_scan(args: argparse.Namespace) -> int:
    from inspector.scan.scanner import scan

    try:
        ckpt = scan(args.path, args.tag, tp_split=tuple(args.tp_split))
    except InspectorError as exc:
        raise _with_roots_named(exc, args.path) from None
    rc = EXIT_DAMAGED if ckpt.errors else EXIT_OK
    try:
        if args.json:
            from inspector.scan.json_view import checkpoint_json

            print_json(checkpoint_json(ckpt))
        else:
            from inspector.cli.render import print_scan

            print_scan(_console(), ckpt, all_tensors=args.tensors)
    except BrokenPipeError:  # the reader stopped early (`| head`): the verdict is still the checkpoint's
        stdout_closed()
    return rc


_DEMO_MAX_RANKS = 8192  # a 4,096-rank run's 8,192 files, and twice that: the scale sweep's largest
_DEMO_MAX_LAYERS = 1024  # 10 parameters a layer: a rank file of ~10,000 records, 8x a 405B model's
_DEMO_MAX_PARAMS = 100_000_000_000


def _demo_spec(args: argparse.Namespace) -> Any:
    """The demo's options, checked: a clear message instead of a traceback or a checkpoint scan rejects."""
    from inspector.demo.writer import DemoSpec
    from inspector.system.units import parse_count

    def bad(message: str) -> InspectorError:
        return InspectorError(message, title="Invalid demo options")

    try:
        params = parse_count(args.params)
    except (ValueError, TypeError) as exc:
        raise bad(f"--params {args.params!r}: {exc}. Use a count such as 2M, 500M or 1.5B.") from None
    if not 1 <= params <= _DEMO_MAX_PARAMS:
        raise bad(f"--params must be between 1 and {_DEMO_MAX_PARAMS:,}; got {params:,}.")
    if not 1 <= args.world_size <= _DEMO_MAX_RANKS:
        raise bad(f"--world-size must be between 1 and {_DEMO_MAX_RANKS}; got {args.world_size}.")
    if args.sub_group_size < 1:
        raise bad(f"--sub-group-size must be positive; got {args.sub_group_size}.")
    if args.layers is not None and not 1 <= args.layers <= _DEMO_MAX_LAYERS:
        raise bad(f"--layers must be between 1 and {_DEMO_MAX_LAYERS:,}; got {args.layers}.")
    if args.bf16_optimizer and (args.stage != 1 or args.dtype != "bf16"):
        raise bad("--bf16-optimizer exists only for --stage 1 with --dtype bf16.")
    return DemoSpec(
        stage=args.stage,
        world_size=args.world_size,
        dtype=args.dtype,
        params=params,
        frozen=not args.no_frozen,
        tied=not args.no_tied,
        bf16_optimizer=args.bf16_optimizer,
        sub_group_size=args.sub_group_size,
        layers=args.layers,
    )


def _demo_bytes(numel: int, tensors: int, spec: Any) -> int:
    """What the demo will write, at most: fp32 master and two Adam moments per parameter (12 B), the 16-bit
    module copy (stage 1/2), ZeRO padding and archive overhead per rank file (a pickle and a zip record of
    some 100 B per tensor in each of its two files: 36 KiB a rank for the 20M demo's 46 tensors)."""
    per_param = 12 + (2 if spec.stage != 3 else 0) + (2 if spec.dtype != "fp32" else 4)
    per_rank = 64 * 1024 + 1024 * tensors
    return numel * per_param + spec.world_size * per_rank + 16 * 1024 * 1024


def cmd_demo(args: argparse.Namespace) -> int:
    from inspector.convert.root import missing_dirs
    from inspector.demo.writer import architecture, discard_demo, fresh_names, write_demo
    from inspector.system.units import format_bytes, plural

    out = os.path.abspath(args.dir)
    spec = _demo_spec(args)
    if os.path.exists(out) and not os.path.isdir(out):
        raise InspectorError(f"{out} exists and is not a folder.", title="Invalid demo options")
    if os.path.exists(out) and os.listdir(out) and not args.overwrite:
        raise InspectorError(
            f"{out} is not empty.",
            hint="Choose a new folder, or pass --overwrite.",
            title="Output folder not empty",
        )
    params, tied = architecture(spec)
    n = sum(p.numel for p in params if p.kind != "buffer" and p.name not in tied)
    need = _demo_bytes(n, len(params), spec)
    probe = out
    while not os.path.exists(probe):
        probe = os.path.dirname(probe)
    free = shutil.disk_usage(probe).free
    if need > free:
        raise InspectorError(
            f"The demo needs about {format_bytes(need)} but {probe} has {format_bytes(free)} free.",
            hint="Choose a smaller --params or a folder on another disk.",
            title="Disk full",
        )
    created, fresh = missing_dirs(os.path.abspath(out)), fresh_names(out, spec)
    done = False
    try:  # a demo that does not complete takes back what it wrote, through an output root
        console = _console()
        with console.status(
            f"Writing a {n:,}-parameter ZeRO-{spec.stage} checkpoint ({plural(spec.world_size, 'rank')}, {spec.dtype})…"
        ) as status:
            tag_dir = write_demo(out, spec, progress=lambda f: status.update(f"Writing {escape(f)}…"))
        done = True
    except ValueError as exc:
        raise InspectorError(str(exc), title="Invalid demo options") from None
    except OSError as exc:
        raise InspectorError(
            f"Writing the demo to {out} failed: {exc.strerror or exc}.",
            hint="Check the folder and free disk space; the partial demo was removed.",
            title="Cannot write output",
        ) from None
    finally:
        if not done:
            discard_demo(out, fresh, created)
    console.print(
        f"Wrote [bold]{escape(tag_dir)}[/] ({n:,} parameters). Try: [bold]{escape(command_hint('scan', out))}[/]"
    )
    return EXIT_OK


COMMANDS = ("scan", "demo", "convert", "verify", "preflight", "health", "open", "completion")


def _route(argv: list[str]) -> list[str]:
    """`zero-inspector PATH ...` and `zero-inspector --demo ...` mean `open`. A first word that is no path but
    looks like a command (`scna`) is refused as an unknown command, with the nearest one suggested."""
    if argv and argv[0] not in COMMANDS and (not argv[0].startswith("-") or "--demo" in argv):
        from inspector.system.bytesource import is_url

        if not argv[0].startswith("-") and not is_url(argv[0]) and not os.path.exists(argv[0]):
            import difflib

            near = difflib.get_close_matches(argv[0], COMMANDS, n=1, cutoff=0.6)
            if near:
                raise InspectorError(
                    f"{argv[0]!r} is neither a command nor a path.",
                    hint=f"Did you mean `zero-inspector {near[0]}`? `zero-inspector --help` lists the commands.",
                    title="Unknown command",
                )
        return ["open", *argv]
    return argv


def _add_common(p: argparse.ArgumentParser) -> None:
    p.add_argument("path", help="checkpoint root (with `latest`), tag folder, Trainer run or Lightning .ckpt")
    p.add_argument("--tag", help="tag to read (default: the one named in `latest`)")
    add_tp_split_option(p)


def build_parser(lazy: bool = False) -> argparse.ArgumentParser:
    """The CLI's parser; `lazy`: each command's options are added when it is used (cli/parser.py), as
    `main` runs it; otherwise all of them now (tests, completion)."""
    parser = Parser(
        prog="zero-inspector",
        description="Inspect DeepSpeed ZeRO checkpoints and convert them to safetensors with flat memory. "
        "No deepspeed needed; no pickled code is ever run. `zero-inspector PATH` opens the terminal UI; "
        "`zero-inspector --demo` opens it on a demo checkpoint.",
    )
    parser.add_argument("-V", "--version", action="version", version=f"zero-inspector {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    add_command(sub, "scan", "show what a checkpoint holds and check it for damage", _scan_options)
    add_command(sub, "demo", "write a realistic demo checkpoint (real DeepSpeed layout)", _demo_options)
    from inspector.cli import convert as cli_convert

    cli_convert.register(sub, _add_common)
    from inspector.cli import health as cli_health

    cli_health.register(sub, _add_common)
    add_open(sub)
    from inspector.cli.completion import add_completion

    add_completion(sub)
    return parser if lazy else fill_all(parser)


def _scan_options(p: argparse.ArgumentParser) -> None:
    _add_common(p)
    p.add_argument("--json", action="store_true", help="print one JSON object instead of tables")
    p.add_argument("--tensors", action="store_true", help="list every tensor instead of grouping by module")
    p.set_defaults(func=cmd_scan)


def _demo_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("dir", help="folder to write the checkpoint root into (created; must be empty)")
    p.add_argument("--stage", type=int, choices=(1, 2, 3), default=2, help="ZeRO stage (default: 2)")
    p.add_argument(
        "--world-size", type=int, default=2, help="data-parallel ranks, one file each (default: 2)"
    )
    p.add_argument(
        "--dtype", choices=("bf16", "fp16", "fp32"), default="bf16", help="training dtype (default: bf16)"
    )
    p.add_argument(
        "--params",
        default="2M",
        help="approximate parameter count, e.g. 2M, 500M, 1.5B (decimal, as model cards write it)",
    )
    p.add_argument("--sub-group-size", type=int, default=1_000_000_000, help="stage 3 sub-group size")
    p.add_argument(
        "--layers",
        type=int,
        help="decoder layers, 10 parameters each (default: 2 to 16 by size); a 405B model has 126: each "
        "stage-3 rank file then holds a record per parameter, ~1,270",
    )
    p.add_argument("--bf16-optimizer", action="store_true", help="stage 1 BF16_Optimizer layout")
    p.add_argument(
        "--no-frozen", action="store_true", help="no frozen parameters (default: a frozen position table)"
    )
    p.add_argument(
        "--no-tied",
        action="store_true",
        help="no tied output head (default: lm_head tied to the token embedding)",
    )
    p.add_argument("--overwrite", action="store_true", help="write into DIR even if it is not empty")
    p.set_defaults(func=cmd_demo)


def _terminate(signum: int, frame: object) -> None:
    raise KeyboardInterrupt  # SIGTERM (schedulers, `timeout`) cleans up exactly like Ctrl-C


def main(argv: Sequence[str] | None = None) -> int:
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _terminate)
        cap_malloc_arenas()  # before any thread: flat memory with many reader threads (system/malloc.py)
    raise_descriptor_limit()  # pools hold every rank's file open where the hard limit allows (descriptors.py)
    one_blas_thread()  # before numpy loads: no BLAS pool spinning beside the workers (system/blas.py)
    parser = build_parser(lazy=True)
    from inspector.cli.completion import complete

    complete(parser)  # a shell asking for completions: answered, and the process exits
    words = list(sys.argv[1:] if argv is None else argv)
    Parser.wants_json = "--json" in words  # a usage error is then one JSON object too
    try:
        routed = _route(words)
    except InspectorError as exc:
        _print_error(exc)
        if Parser.wants_json:
            _json_error(exc)
        return exc.exit_code
    args, unknown = parser.parse_known_args(routed)
    if unknown:  # said with the usage of the command it was given to, not the top level's
        _subparser(parser, getattr(args, "command", None)).error(
            f"unrecognized arguments: {' '.join(unknown)}"
        )
    if not getattr(args, "command", None):
        parser.print_help()
        return EXIT_USAGE
    try:
        return int(args.func(args))
    except InspectorError as exc:
        _print_error(exc)
        if getattr(args, "json", False) and not getattr(exc, "json_printed", False):
            _json_error(exc)
        return exc.exit_code
    except KeyboardInterrupt:
        _console(stderr=True).print("[yellow]Interrupted; partial output (if any) was removed.[/]")
        return EXIT_CANCELLED
    except BrokenPipeError:  # stdout closed by its reader while a command printed: not a failure
        stdout_closed()
        return EXIT_OK


def _subparser(parser: argparse.ArgumentParser, command: str | None) -> argparse.ArgumentParser:
    """The parser of `command` (its usage and options), or the top level's when there is none."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction) and command in action.choices:
            return action.choices[command]  # type: ignore[no-any-return]
    return parser


def _json_error(exc: InspectorError) -> None:
    """`--json` asked for one object on stdout: a failure is one too, beside the message on stderr."""
    error = {"title": exc.title, "message": exc.message, "hint": exc.hint, "exit_code": exc.exit_code}
    from inspector.cli.console import print_json

    try:
        print_json({"error": error})  # the text-out rule, as every JSON document
    except BrokenPipeError:
        stdout_closed()


def entry() -> None:
    sys.exit(main())
