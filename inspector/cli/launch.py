"""`open` (and `zero-inspector PATH`): the app's launch from the command line. What it presets (the selection,
the export options, the TP-split rules the app scans with) is checked here, in the terminal, before the app
starts; the flags that name an output kind (and a merge's base) preset the export form, as they choose the
kind in `convert`."""

from __future__ import annotations

import argparse
import os
import sys

from inspector.cli.options import add_tp_split_option
from inspector.errors import InspectorError


def cmd_open(args: argparse.Namespace) -> int:
    """Open the terminal UI on PATH (or on a fresh demo checkpoint), presetting selection and export."""
    from inspector.convert.order import options_from_args

    if not args.path and not args.demo:
        raise InspectorError("Give a checkpoint PATH to open, or --demo.", title="Nothing to open")
    from inspector.system.bytesource import is_url

    if (
        args.path and not args.demo and not is_url(args.path) and not os.path.exists(args.path)
    ):  # said here, not in a full-screen dialog (a bucket's answer comes from the scan, in the app)
        raise InspectorError(
            f"{args.path} does not exist.",
            hint="Check the path; `zero-inspector --help` lists the commands.",
            title="No such checkpoint",
        )
    kind, base = _preset_kind(args)  # the flags are checked first: their error is the more precise
    if args.selection and (args.include or args.exclude):
        raise InspectorError(
            "--selection and --include/--exclude both choose the tensors.",
            hint="Use one of them.",
            title="Invalid option",
        )
    _refuse_without_terminal(args.path)
    options = options_from_args(args)
    from inspector.tui.app import LaunchOptions, run_app  # the UI stack loads only when the UI is wanted

    return run_app(
        LaunchOptions(
            path=args.path,
            tag=args.tag,
            options=options,
            out_dir=os.path.abspath(args.out) if args.out else None,
            overwrite=args.overwrite,
            demo=args.demo,
            tp_split=tuple(args.tp_split),
            format=kind,
            base=base,
            selection=args.selection or "",
        )
    )


def _refuse_without_terminal(path: str | None) -> None:
    """The app needs a terminal on both ends: started from a script or CI job (stdin or stdout a pipe or a
    file) it would take over a screen nobody sees and wait for keys that never come."""
    missing = [name for name, stream in (("stdin", sys.stdin), ("stdout", sys.stdout)) if not _is_tty(stream)]
    if missing:
        target = path or "PATH"
        raise InspectorError(
            f"The app needs a terminal, but {' and '.join(missing)} {'is' if len(missing) == 1 else 'are'} not one.",
            hint=f"In a script or CI job use the commands: `zero-inspector scan {target}` "
            "(`--json` for one JSON object), `preflight`, `convert`, `verify`.",
            title="No terminal",
        )


def _is_tty(stream: object) -> bool:
    try:
        return bool(stream is not None and stream.isatty())  # type: ignore[attr-defined]
    except (AttributeError, ValueError):  # replaced by an object without isatty, or closed
        return False


def _preset_kind(args: argparse.Namespace) -> tuple[str, str]:
    """The export form's kind and base folder, as `convert` reads the same flags (`--adapter`,
    `--merge-adapter`, `--weights-only`, `--base`): two kinds at once is the same error. `--base` alone
    presets the merge, the one kind that reads a base; a base that is no folder is said here, in the
    terminal, with the CLI's words."""
    from inspector.convert.kinds import DEFAULT
    from inspector.convert.order import KIND_FLAGS, kind_from_args

    if args.base and not any(getattr(args, flag, False) for flag in KIND_FLAGS.values()):
        args.merge_adapter = True
    kind = kind_from_args(args)
    base = ""
    if args.base:
        from inspector.scan.basemodel import resolve_base

        base = resolve_base(args.base, None, None)
    return ("" if kind == DEFAULT else kind), base


def add_open(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    from inspector.cli.parser import add_command

    add_command(sub, "open", "explore a checkpoint in the terminal UI (the default for a PATH)", _options)


def _options(p: argparse.ArgumentParser) -> None:
    from inspector.cli.options import add_convert_options

    p.add_argument("path", nargs="?", help="checkpoint, Trainer run, or a folder holding several checkpoints")
    p.add_argument("--tag", help="tag to open (default: the one named in `latest`)")
    p.add_argument(
        "--demo", action="store_true", help="write a demo checkpoint to a temporary folder and open it"
    )
    p.add_argument("--out", help="preset the export's output folder")
    p.add_argument("--overwrite", action="store_true", help="preset: replace an earlier conversion in --out")
    add_tp_split_option(p)  # the app scans with these rules; its export form shows and edits them
    add_convert_options(p)
    p.set_defaults(func=cmd_open)
