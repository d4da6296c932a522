"""A named selection put in force, or a saved one removed: what the picker (`p`) and the Export form's
Selection field both do, apart from `actions.py` so the screens that do it import no action (and no screen
imports back into them)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from inspector.convert.selections import Selection
    from inspector.tui.shell import Shell


def use_selection(app: Shell, name: str) -> set[str]:
    """A named selection picked (the picker, the Export form): it becomes the selection (the tree follows, the
    filter no longer narrows it), so the preflight and the export take exactly it."""
    assert app.ckpt is not None
    chosen = app.named.pick(app.ckpt, name)
    if chosen != app.selected or app.shown_only is not None:
        app.shown_only = None
        app.main.tensors_pane.module_tree.set_selection(chosen)
        app.selected = set(chosen)
    return chosen


def forget_selection(app: Shell, name: str) -> tuple[Selection, ...]:
    """The picker's `d`: a saved selection removed (from the state file too); what the picker lists now."""
    assert app.ckpt is not None
    problem = app.named.forget(app.ckpt.root, name)
    if problem:
        app.notify(problem, title="Selection not written", severity="warning", timeout=10, markup=False)
    return app.named.listed(app.ckpt)
