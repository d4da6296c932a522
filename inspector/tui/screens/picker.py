"""`p`: the named selections for the shown checkpoint in one list: the ones its layout proposes (a pipeline
stage, an expert, a TP split group, frozen/trainable, the LoRA adapter) and the user's saved ones (`m`).
Enter makes the highlighted one the selection (`e` then exports exactly it); `d` removes a saved one."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import OptionList, Static
from textual.widgets.option_list import Option

from inspector.convert.selections import Selection
from inspector.scan.model import Checkpoint
from inspector.system.units import format_bytes
from inspector.tui.fmt import shown
from inspector.tui.typed import zi


def row(s: Selection, ckpt: Checkpoint, name_width: int) -> Text:
    """One line (never wrapped: a narrow terminal cuts its end): the name, how many tensors and bytes, and
    where it comes from (the layout's record, or you)."""
    n = len(s.tensors)
    size = format_bytes(sum(ckpt.tensor(t).nbytes for t in s.tensors))
    line = Text(no_wrap=True, overflow="ellipsis")
    line.append(f"{shown(s.name):<{name_width}}  ", style="bold")
    line.append(f"{n:>4} tensor{'s' if n != 1 else ' '}  {size:>9}  ")
    line.append(s.why if s.proposed else "saved by you", style="dim italic")
    return line


class SelectionPicker(ModalScreen[str | None]):
    """Pick a named selection; dismissed with its name, or None (escape)."""

    BINDINGS = [
        Binding("escape,q", "close", "Cancel"),
        Binding("d", "forget", "Remove a saved one"),
    ]
    AUTO_FOCUS = "#picker-list"

    def __init__(self, listed: tuple[Selection, ...], ckpt: Checkpoint) -> None:
        super().__init__(classes="dialog")
        self.listed, self.ckpt = listed, ckpt

    def compose(self) -> ComposeResult:
        with Vertical(id="dialog-box", classes="picker"):
            yield Static("Selections for this checkpoint", id="dialog-title", markup=False)
            yield OptionList(id="picker-list")
            yield Static(
                "Proposed from the checkpoint's layout, then yours. enter selects (e exports exactly it) · "
                "d removes one you saved · m saves the current selection · esc back",
                id="dialog-hint",
                markup=False,
            )

    def on_mount(self) -> None:
        self.refill()

    def refill(self) -> None:
        box = self.query_one(OptionList)
        width = min(max((len(shown(s.name)) for s in self.listed), default=8), 24)
        box.clear_options()
        if not self.listed:
            box.add_option(Option("None yet: select tensors and press m to save some.", id="", disabled=True))
            return
        box.add_options([Option(row(s, self.ckpt, width), id=str(i)) for i, s in enumerate(self.listed)])
        box.highlighted = 0

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        if event.option.id:
            self.dismiss(self.listed[int(event.option.id)].name)

    def action_forget(self) -> None:
        """Remove the highlighted selection if it is one you saved (a proposed one comes from the layout)."""
        box = self.query_one(OptionList)
        if box.highlighted is None or not self.listed:
            return
        chosen = self.listed[box.highlighted]
        if chosen.proposed:
            self.notify("That one is proposed from the checkpoint's layout; only saved ones are removed.")
            return
        from inspector.tui.picking import forget_selection

        self.listed = forget_selection(zi(self), chosen.name)
        self.refill()

    def action_close(self) -> None:
        self.dismiss(None)
