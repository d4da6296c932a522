"""Findings as the app draws them, the scan's on the overview and the health pass's on its tab alike, drawn
the one way the CLI draws them too (`faces.findings`)."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence

from rich.console import RenderableType

from inspector.faces.findings import findings_grid
from inspector.scan.summary import FindingLike


def findings_renderable(
    items: Sequence[FindingLike], ok: str, shown_max: int = 30, more: str = ""
) -> RenderableType:
    """Errors first, each wrapped under its own column with its file and what to do; `ok` when there are
    none; `more` says where the ones past `shown_max` are (fewer than the CLI's: the app's panes are short)."""
    return findings_grid([in_the_app(f) for f in items], ok, shown_max, more)


_TP_FLAG = re.compile(r"(?:a |the split: )?--tp-split PATTERN=0\|1\|replicated")


def in_the_app(finding: FindingLike) -> FindingLike:
    """A finding's remedy as the app offers it: where the CLI says `--tp-split PATTERN=…`, the app has the
    export form's TP splits field (the scan's text is the CLI's; the app points at its own field)."""
    hint = getattr(finding, "hint", None)
    if not hint or "--tp-split" not in hint or not dataclasses.is_dataclass(finding):
        return finding
    said = _TP_FLAG.sub("rules in the export form's TP splits field (e; --tp-split in the CLI)", hint)
    return dataclasses.replace(finding, hint=said)  # type: ignore[type-var]
