"""The CLI's exits: its Rich consoles, its JSON printer and the one way a user error is printed.

Every string reaches the terminal through `text.shown` (secrets redacted, controls escaped) by
construction: the console applies it to every string before Rich parses it (`render_str`: tables, panels,
status lines, progress bars), and escapes every segment it writes (`_render_buffer`: `Text` built directly,
which the renderers also build from `shown` text), so no command can print a raw control character. Rich markup in data is escaped where it is interpolated into
our own markup (`literal`).
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from functools import cache
from typing import Any

from inspector.errors import InspectorError
from inspector.text import escape, has_unsafe, shown, shown_doc


def console(stderr: bool = False) -> Any:
    """A rich Console; rich costs ~30 ms to import, so only the commands that print pay for it.

    Paths are shown literally: no emoji codes (`:x:` stays `:x:`), no highlighting. A reader that closes the
    pipe (`scan X | head -1`) is not an error: the rest of the output is dropped, the exit code stays the
    command's own."""
    c = _safe_console_class()(stderr=stderr, highlight=False, emoji=False)
    c.on_broken_pipe = _on_broken_pipe  # type: ignore[method-assign]  # per instance, not process-wide
    return c


@cache
def _safe_console_class() -> Any:
    """A rich Console whose every string and every written segment passes `shown` (built on first use)."""
    from rich.console import Console
    from rich.segment import Segment

    class SafeConsole(Console):
        def render_str(self, text: str, **kwargs: Any) -> Any:
            return super().render_str(shown(text, newlines=True), **kwargs)

        def _render_buffer(self, buffer: Any) -> str:
            return str(super()._render_buffer(_escaped(buffer)))

        def print(self, *objects: Any, **kwargs: Any) -> None:
            """Off a terminal (a pipe, a CI log) nobody resizes the window: each print gets the width it
            needs, so no name is cut with "…" or folded across lines (Rich would assume 80 columns)."""
            if self.is_terminal or not objects:
                return super().print(*objects, **kwargs)
            own = self._width
            self.width = max(self.width, _needed_width(self, objects))
            try:
                super().print(*objects, **kwargs)
            finally:
                self._width = own

    def _escaped(buffer: Any) -> Any:
        for seg in buffer:
            if not seg.control and has_unsafe(seg.text.replace("\n", "")):
                seg = Segment(escape(seg.text, newlines=True), seg.style)
            yield seg

    return SafeConsole


def _needed_width(console: Any, objects: tuple[Any, ...]) -> int:
    """The widest natural width of what is about to be printed (tables: every column unwrapped)."""
    from rich.errors import NotRenderableError
    from rich.measure import Measurement

    options = console.options.update_width(1 << 20)
    need = 0
    for obj in objects:
        try:
            renderable = console.render_str(obj) if isinstance(obj, str) else obj
            need = max(need, Measurement.get(console, options, renderable).maximum)
        except NotRenderableError:
            continue
    return min(need, 1 << 16)  # a guard, not a layout choice: no real name is this long


def print_json(doc: Any) -> None:
    """The CLI's one JSON exit (`scan --json`, `preflight --json`, `health --json`): every string `shown`."""
    print(json.dumps(shown_doc(doc), indent=1), flush=True)


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


def literal(text: str, *, newlines: bool = False) -> str:
    """Text from a checkpoint (names, paths, versions) for a markup string: `shown`, and with Rich markup
    escaped so `[bold]` stays text. `newlines`: a message of ours, whose line breaks stay."""
    from rich.markup import escape

    return escape(shown(text, newlines=newlines))


def print_error(exc: InspectorError) -> None:
    """Print one user error: title and message, then what to do. Paths are escaped, never read as markup."""
    err = console(stderr=True)
    err.print(f"[bold red]{literal(exc.title)}:[/] {literal(exc.message, newlines=True)}", soft_wrap=True)
    if exc.hint:
        err.print(f"[italic]→ {literal(exc.hint, newlines=True)}[/]", soft_wrap=True)
