"""Findings drawn the one way both faces show them: the scan's and the health pass's, in the CLI's panel and
on the app's overview and Health tab. Which lines to show is the core's (`scan.summary.finding_lines`);
this module only gives them their labels, colours and layout."""

from __future__ import annotations

from collections.abc import Sequence

from rich.console import RenderableType
from rich.table import Table
from rich.text import Text

from inspector.scan.model import Severity
from inspector.scan.summary import FindingLike, finding_lines
from inspector.text import shown

SEVERITY_LABEL = {
    Severity.ERROR: ("✖ error", "bold red"),
    Severity.WARNING: ("▲ warning", "yellow"),
    Severity.INFO: ("● info", "cyan"),
}


def findings_grid(items: Sequence[FindingLike], ok: str, shown_max: int, more: str = "") -> RenderableType:
    """Errors first, each message wrapped under its own column with its file and what to do; `✔ ok` when
    there are none; `more` says where the ones past `shown_max` are."""
    lines, rest = finding_lines(items, shown_max)
    if not lines:
        return Text(f"✔ {ok}", style="green")
    grid = Table.grid(padding=(0, 1))
    grid.add_column(no_wrap=True)
    grid.add_column(ratio=1)
    for f in lines:
        label, style = SEVERITY_LABEL[f.severity]
        what = Text(shown(f.message))
        if f.file:
            what.append(f"\n{shown(f.file)}", style="dim")
        if f.hint:
            what.append(f"\n→ {shown(f.hint)}", style="italic")
        grid.add_row(Text(label, style=style), what)
    if rest:
        grid.add_row("", Text(f"… and {rest} more{more}", style="dim"))
    return grid
