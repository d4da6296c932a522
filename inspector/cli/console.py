"""Rich consoles and the one way a user error is printed (stderr, markup escaped, no traceback)."""

from __future__ import annotations

from typing import Any

from inspector.errors import InspectorError


def console(stderr: bool = False) -> Any:
    """A rich Console; rich costs ~30 ms to import, so only the commands that print pay for it."""
    from rich.console import Console

    return Console(stderr=stderr, highlight=False, emoji=False)


def print_error(exc: InspectorError) -> None:
    """Print one user error: title and message, then what to do. Paths are escaped, never read as markup."""
    from rich.markup import escape

    err = console(stderr=True)
    err.print(f"[bold red]{escape(exc.title)}:[/] {escape(exc.message)}", soft_wrap=True)
    if exc.hint:
        err.print(f"[italic]→ {escape(exc.hint)}[/]", soft_wrap=True)
