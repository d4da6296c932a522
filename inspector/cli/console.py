"""Rich consoles and the one way a user error is printed (stderr, markup escaped, no traceback)."""

from __future__ import annotations

import contextlib
import os
import sys
from typing import Any

from inspector.errors import InspectorError
from inspector.system.units import printable


def console(stderr: bool = False) -> Any:
    """A rich Console; rich costs ~30 ms to import, so only the commands that print pay for it.

    Paths are shown literally: no emoji codes (`:x:` stays `:x:`), no highlighting. A reader that closes the
    pipe (`scan X | head -1`) is not an error: the rest of the output is dropped, the exit code stays the
    command's own."""
    from rich.console import Console

    c = Console(stderr=stderr, highlight=False, emoji=False)
    c.on_broken_pipe = _on_broken_pipe  # type: ignore[method-assign]  # per instance, not process-wide
    return c


def _on_broken_pipe() -> None:
    """Rich's default exits 1 (our "damaged"); drop further output and let the command finish instead."""
    stdout_closed()
    raise BrokenPipeError


def stdout_closed() -> None:
    """Point stdout at /dev/null so later writes (and the interpreter's final flush) do not fail again."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    with contextlib.suppress(OSError, ValueError):
        os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)


def literal(text: str) -> str:
    """Text from a checkpoint (names, paths, versions) for a markup string: printable, and with Rich markup
    escaped so `[bold]` stays text."""
    from rich.markup import escape

    return escape(printable(text))


def print_error(exc: InspectorError) -> None:
    """Print one user error: title and message, then what to do. Paths are escaped, never read as markup."""
    err = console(stderr=True)
    err.print(f"[bold red]{literal(exc.title)}:[/] {literal(exc.message)}", soft_wrap=True)
    if exc.hint:
        err.print(f"[italic]→ {literal(exc.hint)}[/]", soft_wrap=True)
