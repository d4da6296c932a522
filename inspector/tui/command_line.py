"""`y`: the `zero-inspector convert …` command that does what the app would do with the shown checkpoint,
the selection and the export form. Built from the very order the app's conversion child is sent on stdin
(`convert.order`), through that order's own `to_argv`, so the command and the app's export cannot drift
apart."""

from __future__ import annotations

from typing import Any

from inspector.convert.order import to_argv
from inspector.text import shell_command
from inspector.tui.jobs import app_order

PROGRAM = "zero-inspector"


def convert_argv(app: Any, *, force: bool = False) -> list[str]:
    """The `convert` arguments for the current checkpoint, selection and export form."""
    return list(to_argv(app_order(app, app.export.out_dir, force=force)))


def convert_command(app: Any) -> str:
    """The command line as a shell would take it (`text.shell_command`: every argument quoted, controls and
    undecodable bytes as `$'\\x1b'` escapes, so a crafted folder name cannot run code when pasted). A damaged
    checkpoint gets --force: the app converts one only after asking, and so does this line, by its flag.
    ShellTextError for a name no shell line can carry."""
    return shell_command([PROGRAM, *convert_argv(app, force=bool(app.ckpt.errors))])
