"""Findings as the app draws them, the scan's on the overview and the health pass's on its tab alike: which
lines to show comes from `scan.summary.finding_lines`, as the CLI's do."""

from __future__ import annotations

from collections.abc import Sequence

from rich.console import RenderableType
from rich.table import Table
from rich.text import Text

from inspector.scan.model import Severity
from inspector.scan.summary import FindingLike, finding_lines
from inspector.tui.fmt import shown

SEVERITY = {
    Severity.ERROR: ("✖ error", "bold red"),
    Severity.WARNING: ("▲ warning", "yellow"),
    Severity.INFO: ("● info", "cyan"),
}


def findings_renderable(
    items: Sequence[FindingLike], ok: str, shown_max: int = 30, more: str = ""
) -> RenderableType:
    """Errors first, each wrapped under its own column with its file and what to do; `ok` when there are
    none; `more` says where the ones past `shown_max` are."""
    lines, rest = finding_lines(items, shown_max)
    if not lines:
        return Text(f"✔ {ok}", style="green")
    grid = Table.grid(padding=(0, 1))
    grid.add_column(no_wrap=True)
    grid.add_column(ratio=1)
    for f in lines:
        label, style = SEVERITY[f.severity]
        what = Text(shown(f.message))
        if f.file:
            what.append(f"\n{shown(f.file)}", style="dim")
        if f.hint:
            what.append(f"\n→ {shown(f.hint)}", style="italic")
        grid.add_row(Text(label, style=style), what)
    if rest:
        grid.add_row("", Text(f"… and {rest} more{more}", style="dim"))
    return grid
