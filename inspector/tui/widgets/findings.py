"""Findings as the app draws them, the scan's on the overview and the health pass's on its tab alike, drawn
the one way the CLI draws them too (`faces.findings`)."""

from __future__ import annotations

from collections.abc import Sequence

from rich.console import RenderableType

from inspector.faces.findings import findings_grid
from inspector.scan.summary import FindingLike


def findings_renderable(
    items: Sequence[FindingLike], ok: str, shown_max: int = 30, more: str = ""
) -> RenderableType:
    """Errors first, each wrapped under its own column with its file and what to do; `ok` when there are
    none; `more` says where the ones past `shown_max` are (fewer than the CLI's: the app's panes are short)."""
    return findings_grid(items, ok, shown_max, more)
