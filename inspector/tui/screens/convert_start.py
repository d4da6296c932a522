"""`c`: what is checked before the convert screen opens. Nothing selected, an output folder that holds
something else, or a damaged checkpoint is said (or asked) here, so the screen itself only ever runs an
order the user has agreed to."""

from __future__ import annotations

from typing import Any

from inspector.convert.kinds import DEFAULT, get
from inspector.tui.fmt import plural, shown
from inspector.tui.screens.convert import ConvertScreen
from inspector.tui.screens.dialogs import ConfirmDialog
from inspector.tui.session import exported


def start_conversion(app: Any) -> None:
    """`c`: open the convert screen; it preflights, asks if needed, then starts the child."""
    kind = get(app.export.format or DEFAULT)
    if not exported(app.selected, app.shown_only) and kind.uses_selection:
        app.notify(
            "Nothing selected is shown: choose tensors on the Tensors tab (space, a), or clear the filter.",
            severity="warning",
        )
        return
    out = app.export.out_dir
    if busy := kind.busy(app.ckpt, out, app.export.overwrite):
        from inspector.tui.screens.export import (
            ExportScreen,  # what the form already marks: said before starting
        )

        app.notify(
            f"{shown(busy)}: tick 'replace an earlier conversion' in the export form, or choose another "
            "folder.",
            title="Output folder not empty",
            severity="warning",
            timeout=8,
            markup=False,
        )
        if not isinstance(app.screen, ExportScreen):
            app.push_screen(ExportScreen())
        return
    if app.ckpt.errors:

        def answer(yes: bool | None) -> None:
            if yes:
                app.push_screen(ConvertScreen(force=True))

        app.push_screen(
            ConfirmDialog(
                "Convert a damaged checkpoint?",
                f"The scan found {plural(len(app.ckpt.errors), 'error')}, e.g. {shown(app.ckpt.errors[0].message)}\n"
                "Converting it would likely write wrong weights.",
                yes="Convert anyway",
            ),
            answer,
        )
        return
    app.push_screen(ConvertScreen())
