"""A refusal in the app points at the app's own field (#42 item 5): the scan's "--tp-split PATTERN=…" remedy
reads, in the app's findings, as the export form's TP splits field (the flag named for the CLI)."""

from __future__ import annotations

from inspector.scan.layouts.tensor.scanner import _recipe_problem
from inspector.tui.widgets.findings import in_the_app


def test_tp_remedy_points_at_the_form_field() -> None:
    finding = _recipe_problem(None, "mp_rank_00_model_states.pt")
    assert finding is not None and "--tp-split PATTERN" in (finding.hint or "")
    said = in_the_app(finding).hint or ""
    assert "the export form's TP splits field" in said and "--tp-split in the CLI" in said
    assert "--tp-split PATTERN" not in said
    assert in_the_app(finding).message == finding.message
