"""Findings as the app draws them, for the scan's and the health pass's alike: one renderer, so both tabs
label, order, wrap and cap them the same way."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from rich.console import RenderableType
from rich.table import Table
from rich.text import Text

from inspector.scan.model import Severity
from inspector.tui.fmt import shown

SEVERITY = {
    Severity.ERROR: ("✖ error", "bold red"),
    Severity.WARNING: ("▲ warning", "yellow"),
    Severity.INFO: ("● info", "cyan"),
}
_ORDER = list(Severity)


class FindingLike(Protocol):
    """What both kinds of finding have (`scan.model.Finding`, `health.HealthFinding`)."""

    @property
    def severity(self) -> Severity: ...

    @property
    def message(self) -> str: ...

    @property
    def hint(self) -> str: ...


def findings_renderable(
    items: Sequence[FindingLike], ok: str, shown_max: int = 30, more: str = ""
) -> RenderableType:
    """Errors first, each with its file (scan findings name one) and what to do, wrapped under its own
    column; `ok` when there are none; past `shown_max` the rest counted, not dropped (`more` says where
    they all are)."""
    if not items:
        return Text(f"✔ {ok}", style="green")
    grid = Table.grid(padding=(0, 1))
    grid.add_column(no_wrap=True)
    grid.add_column(ratio=1)
    ordered = sorted(items, key=lambda f: _ORDER.index(f.severity))  # stable: each kind's own order kept
    for f in ordered[:shown_max]:
        label, style = SEVERITY[f.severity]
        what = Text(shown(f.message))
        if file := getattr(f, "file", None):
            what.append(f"\n{shown(file)}", style="dim")
        if f.hint:
            what.append(f"\n→ {shown(f.hint)}", style="italic")
        grid.add_row(Text(label, style=style), what)
    if len(items) > shown_max:
        grid.add_row("", Text(f"… and {len(items) - shown_max} more{more}", style="dim"))
    return grid
