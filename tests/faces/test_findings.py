"""The findings both faces draw: what the CLI prints is what the app shows, line for line."""

from __future__ import annotations

from rich.console import Console

from inspector.cli.render import findings
from inspector.faces.findings import findings_grid
from inspector.scan.model import Finding, Severity
from inspector.tui.widgets.findings import findings_renderable


def _text(renderable: object, width: int = 100) -> str:
    console = Console(width=width, record=True, color_system=None)
    console.print(renderable)
    return console.export_text()


def _items() -> list[Finding]:
    return [
        Finding(Severity.INFO, "i", "an info line"),
        Finding(Severity.ERROR, "e", "rank 1 is missing", file="zero_pp_rank_1.pt", hint="copy it again"),
        Finding(Severity.WARNING, "w", "a \x1b]2;title\x07 warning", hint="look"),
    ]


def test_errors_first_with_their_file_and_hint_and_controls_escaped() -> None:
    out = _text(findings_grid(_items(), "fine", shown_max=10))
    lines = [line.rstrip() for line in out.splitlines()]
    assert lines[0].startswith("✖ error") and lines[0].endswith("rank 1 is missing")
    assert lines[1].strip() == "zero_pp_rank_1.pt"
    assert lines[2].strip() == "→ copy it again"
    assert lines[3].startswith("▲ warning") and "\\x1b]2;title\\x07" in lines[3]
    assert "\x1b" not in out and "\x07" not in out
    assert lines[5].startswith("● info")


def test_none_says_ok_and_past_the_limit_says_how_many_more_and_where() -> None:
    assert _text(findings_grid([], "all good", shown_max=10)).strip() == "✔ all good"
    out = _text(findings_grid(_items(), "fine", shown_max=1, more=" (see --json)"))
    assert "✖ error" in out and "▲ warning" not in out
    assert "… and 2 more (see --json)" in out


def test_both_faces_draw_the_same_lines_each_with_its_own_limit() -> None:
    many = [Finding(Severity.WARNING, "w", f"warning {i}") for i in range(45)]
    assert _text(findings(many)) == _text(findings_grid(many, "No problems found.", 40))
    assert _text(findings_renderable(many, "ok")) == _text(findings_grid(many, "ok", 30))
    assert "… and 5 more" in _text(findings(many)) and "… and 15 more" in _text(findings_renderable(many, "ok"))
