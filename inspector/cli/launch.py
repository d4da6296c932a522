"""`open` (and `zero-inspector PATH`): the app's launch from the command line. What it presets (the selection,
the export options, the TP-split rules the app scans with) is checked here, in the terminal, before the app
starts; the flags that name an output kind are refused, since the kind is chosen in the app."""

from __future__ import annotations

import argparse
import os
import sys

from inspector.cli.options import add_tp_split_option
from inspector.errors import InspectorError, InvalidOptionError


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
    _refuse_unapplied(args)
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


def _refuse_unapplied(args: argparse.Namespace) -> None:
    """`open` presets the selection and the export options; the output kind is chosen in the export form, so
    the flags that name a kind (or a merge's base) are refused rather than silently dropped."""
    given = [flag for flag, dest in _KIND_ONLY if getattr(args, dest, None)]
    if given:
        raise InvalidOptionError(
            f"`open` does not take {' or '.join(given)}: the output kind is chosen in the app's export form (e).",
            hint="Open the checkpoint and choose the format there, or run `zero-inspector convert` with "
            + " ".join(given)
            + ".",
        )


_KIND_ONLY = (
    ("--adapter", "adapter"),
    ("--merge-adapter", "merge_adapter"),
    ("--weights-only", "weights_only"),
    ("--base", "base"),
)


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
