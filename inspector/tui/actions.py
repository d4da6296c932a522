"""What the app's keys do beyond opening a screen: quit with a conversion running, refuse to export with no
checkpoint, copy the equivalent command, step through tags. Functions of the app (as `commands.py` and
`command_line.py` are), so `app.py` keeps only the state it shares between screens and the scan worker."""

from __future__ import annotations

from typing import TYPE_CHECKING

from inspector.errors import InspectorError, InvalidOptionError

if TYPE_CHECKING:
    from inspector.convert.selections import Selection
    from inspector.scan.model import Checkpoint
    from inspector.tui.shell import Shell


def help_section(app: Shell) -> str:
    """Which part of the help is about the screen (or tab) in front: it comes first."""
    from inspector.tui.screens.convert import ConvertScreen
    from inspector.tui.screens.export import ExportScreen

    if isinstance(app.screen, ExportScreen):
        return "Export options"
    if isinstance(app.screen, ConvertScreen):
        return "Convert"
    if app.screen is app.screen_stack[0]:
        return str(app.main.query_one("#tabs").active).capitalize()
    return ""


def quit_app(app: Shell) -> None:
    """Quit at once, or, with a conversion running, pause it and ask (it resumes on "no")."""
    if not app.converting:
        app.exit(0)
        return
    from inspector.tui.screens.convert import ConvertScreen
    from inspector.tui.screens.dialogs import ConfirmDialog

    running = [s for s in app.screen_stack if isinstance(s, ConvertScreen) and s.busy]
    words = "; ".join(s.cancel_words() for s in running)
    held = " ".join(dict.fromkeys(s.held_words() for s in running)) or "It is paused while you decide."

    def answer(yes: bool | None) -> None:
        if yes:
            app.stop_children()
            app.exit(0)
        else:
            for s in running:
                s.resume_child()

    for s in running:
        s.pause_child()
    app.push_screen(
        ConfirmDialog(
            "Quit?",
            f"A conversion is running. {held} Quitting cancels it: "
            f"{words or 'its partial output is removed'}.",
            yes="Quit",
        ),
        answer,
    )


def need_checkpoint(app: Shell) -> bool:
    """True when a checkpoint is shown; else say why there is nothing to export yet."""
    if app.ckpt is None and app.refused is not None:
        app.notify(
            f"{app.refused.title}: nothing to export. Choose another root (r) or tag ([, ]).",
            title="No readable checkpoint",
            severity="warning",
            markup=False,
        )
        return False
    if app.ckpt is None:
        app.notify(
            "Wait for the scan to finish (or open a checkpoint).",
            title="No checkpoint yet",
            severity="warning",
        )
        return False
    return True


def on_main(app: Shell, what: str) -> bool:
    """Switching checkpoints happens on the main screen: the export form and a conversion belong to the
    shown one."""
    if app.screen is app.screen_stack[0]:
        return True
    app.notify(f"Go back to the checkpoint first (escape) to {what}.", severity="warning", timeout=4)
    return False


def yank(app: Shell) -> None:
    """`y`: the equivalent `zero-inspector convert …` line, shown and copied (and the tensor under the
    cursor on the Tensors tab)."""
    from inspector.text import ShellTextError
    from inspector.tui.command_line import convert_command
    from inspector.tui.screens.dialogs import CopyDialog

    if not need_checkpoint(app):
        return
    name = ""
    if app.screen is app.screen_stack[0]:
        node = app.main.tensors_pane.module_tree.cursor_node
        data = node.data if node is not None else None
        if app.main.query_one("#tabs").active == "tensors" and data is not None:
            name = getattr(data, "name", "") if not hasattr(data, "path") else data.path
    try:
        command = convert_command(app)
    except ShellTextError as exc:
        app.notify(f"No shell line can name this path: {exc}.", title="Cannot copy", severity="error")
        return
    app.push_screen(CopyDialog(command, name))


def step_tag(app: Shell, step: int) -> None:
    """`[` and `]`: the previous or next tag of the shown root (from a missing or refused tag too)."""
    if app.root is None or not on_main(app, "switch tags"):
        return
    tags = list(app.ckpt.tags if app.ckpt is not None else app.tags)
    if app.ckpt is None:  # the asked-for tag is missing or refused: step from it, or open the latest
        if app.refused is None or not tags:
            return  # still scanning: the next key waits for it
        if app.asked_tag in tags:
            i = tags.index(app.asked_tag)
            j = min(max(i + step, 0), len(tags) - 1)
        else:
            i, j = -1, tags.index(app.latest_tag) if app.latest_tag in tags else len(tags) - 1
        if j != i:
            app.scan(app.root, tags[j])
        return
    i = tags.index(app.ckpt.tag) if app.ckpt.tag in tags else 0
    j = min(max(i + step, 0), len(tags) - 1)
    if j != i:
        app.scan(app.root, tags[j])
    elif len(tags) == 1:
        app.notify("This checkpoint has one tag: there is no other to open.", timeout=3, markup=False)
    else:
        which = "oldest" if step < 0 else "newest"
        app.notify(f"Already the {which} tag ({len(tags)} in all).", timeout=3, markup=False)


def worker_error(err: BaseException, description: str) -> InspectorError:
    """A background task's failure as the error dialog shows it: our own error as it is, anything else as
    the bug it is."""
    if isinstance(err, InspectorError):
        return err
    return InspectorError(
        f"{type(err).__name__}: {err}",
        hint="This is a bug in zero-inspector; please report it with the checkpoint's `scan --json`.",
        title=f"Unexpected error in {description or 'a background task'}",
    )


def name_selection(app: Shell) -> None:
    """`m`: save what `e` would export (the selection, narrowed by the filter) under a name, for this root (in
    the state file, so it lasts); the picker (`p`) and the Export form's Selection field pick it again."""
    from inspector.tui.screens.dialogs import NameDialog
    from inspector.tui.session import exported

    if not need_checkpoint(app):
        return
    assert app.ckpt is not None
    chosen = exported(app.selected, app.shown_only)
    root, tag = app.ckpt.root, app.ckpt.tag

    def answer(name: str | None) -> None:
        if name is None:
            return
        from inspector.tui.picking import save_selection

        try:
            save_selection(app, root, name, chosen, tag)  # the file written by a worker, which says so
        except InspectorError as exc:
            app.notify(f"{exc.message} {exc.hint}", title=exc.title, severity="warning", markup=False)

    app.push_screen(NameDialog(len(chosen), app.named.names(root)), answer)


def offer_selections(app: Shell, offered: tuple[Selection, ...], problem: str) -> None:
    """A scan's proposals become the picker's; a saved-selections file that could not be read is said once."""
    app.named.offered = offered
    if problem:
        app.notify(problem, title="Saved selections ignored", severity="warning", timeout=10, markup=False)


def pick_selection(app: Shell) -> None:
    """`p`: the picker; the chosen selection is put in force and said."""
    from inspector.tui.picking import use_selection
    from inspector.tui.screens.picker import SelectionPicker

    if not need_checkpoint(app):
        return
    assert app.ckpt is not None

    def answer(name: str | None) -> None:
        if name is None or app.ckpt is None:
            return
        try:
            chosen = use_selection(app, name)  # tui/picking
        except InspectorError as exc:
            app.notify(f"{exc.message} {exc.hint}", title=exc.title, severity="warning", markup=False)
            return
        from inspector.system.units import plural

        said = f"{name}: {plural(len(chosen), 'tensor')} selected; e exports them."
        app.notify(said, title="Selection", markup=False)

    app.push_screen(SelectionPicker(app.named.listed(app.ckpt), app.ckpt), answer)


def preset(app: Shell, ckpt: Checkpoint, selection: str) -> set[str]:
    """The first checkpoint's selection from the command line: `--selection NAME` (proposed or saved, as
    `convert --selection` resolves it; not with --include/--exclude), else `--include/--exclude`."""
    from inspector.tui.session import preset_selection

    opts = app.base_options
    if selection and (opts.include or opts.exclude):
        raise InvalidOptionError(
            "--selection and --include/--exclude both choose the tensors.", hint="Use one of them."
        )
    return app.named.pick(ckpt, selection) if selection else preset_selection(ckpt, opts)


def open_help(app: Shell) -> None:
    """`?`: the help, the part about the screen in front first."""
    from inspector.tui.screens.help import HelpScreen

    if not isinstance(app.screen, HelpScreen):
        app.push_screen(HelpScreen(help_section(app)))
