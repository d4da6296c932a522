"""A named selection put in force, saved or removed: what the picker (`p`), the Export form's Selection field
and `m` do, apart from `actions.py` so the screens that do it import no action (and no screen imports back
into them). The state file is written in a worker thread (`written`), never on the UI thread: it is locked and
fsynced, which a busy or network disk makes slow."""

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
    """The picker's `d`: a saved selection removed (from the state file too, by a worker); what the picker
    lists now."""
    assert app.ckpt is not None
    app.named.drop(app.ckpt.root, name)
    written(app, "")
    return app.named.listed(app.ckpt)


def save_selection(app: Shell, root: str, name: str, tensors: set[str], tag: str) -> None:
    """`m`'s name given: kept for the run at once (a bad name refused here, InvalidOptionError), written to
    the state file by a worker, which says when it is saved."""
    from inspector.system.units import plural
    from inspector.text import quoted

    name = app.named.keep(root, name, tensors, tag)
    said = f"Saved {quoted(name)}: {plural(len(tensors), 'tensor')}. p lists it; so does the Export form."
    written(app, said)


def written(app: Shell, saved: str) -> None:
    """The oldest queued change to the saved selections written by a worker thread (one worker per change,
    `NamedSelections.write_next` keeps their order); `saved` said when it is written, the problem when not
    (the selection is kept for this run). A bug in the write is the worker's error dialog, never a crash."""

    def write() -> None:
        problem = app.named.write_next()
        if problem:  # App.notify is thread-safe: it posts a message to the app
            app.notify(problem, title="Selection not written", severity="warning", timeout=10, markup=False)
        elif saved:
            app.notify(saved, title="Selection saved", markup=False)

    app.run_worker(
        write, thread=True, group="selections", exit_on_error=False, description="saving selections"
    )
