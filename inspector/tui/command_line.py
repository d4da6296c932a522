"""`y`: the `zero-inspector convert …` command that does what the app would do with the shown checkpoint,
the selection and the export form. Built from what the app's conversion child is given (its argv, or the
order it gets on stdin where that protocol exists), so the command and the app's export cannot drift apart."""

from __future__ import annotations

import shlex
from typing import Any

from inspector.tui.jobs import convert_args

PROGRAM = "zero-inspector"


def convert_argv(app: Any, *, force: bool = False) -> list[str]:
    """The `convert` arguments for the current checkpoint, selection and export form. Where the conversion
    protocol sends the child one frozen order (`convert.order`), the line is that order's own `to_argv`;
    before it, the child's argv itself, without the machine-readable progress the app asks of its child."""
    try:
        from inspector.convert.order import to_argv  # type: ignore[import-not-found, unused-ignore]
        from inspector.tui.jobs import app_order  # type: ignore[attr-defined, unused-ignore]
    except ImportError:
        return _child_argv(app, force)
    return list(to_argv(app_order(app, app.export.out_dir, force=force)))


def _child_argv(app: Any, force: bool) -> list[str]:
    """`jobs.convert_args`, the argv the app's conversion child is started with, less `--progress json`."""
    ckpt = app.ckpt
    args = convert_args(
        ckpt.root,
        ckpt.tag,
        app.export.out_dir,
        app.convert_options(),
        overwrite=app.export.overwrite,
        force=force,
        kind=app.export.format,
        executor=app.export.executor,
        ray_address=app.export.ray_address,
    )
    if args[-2:] == ["--progress", "json"]:
        args = args[:-2]
    return args


def convert_command(app: Any) -> str:
    """The command line as a shell would take it (every argument quoted where it needs to be). A damaged
    checkpoint gets --force: the app converts one only after asking, and so does this line, by its flag."""
    return shlex.join([PROGRAM, *convert_argv(app, force=bool(app.ckpt.errors))])
