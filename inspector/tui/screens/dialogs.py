"""Modal dialogs: yes/no confirmation, an error message with what, why and what to do, and a name to save the
selection under."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Input, Static

from inspector.tui.fmt import plural, shown, shown_lines


class ConfirmDialog(ModalScreen[bool]):
    """A question; `y`/enter answers yes, `n`/escape no."""

    BINDINGS = [Binding("y", "answer(True)", "Yes"), Binding("n,escape", "answer(False)", "No")]
    AUTO_FOCUS = "#no"

    def __init__(self, title: str, question: str, yes: str = "Yes", no: str = "No") -> None:
        super().__init__(classes="dialog")
        self.title_text, self.question, self.yes, self.no = title, question, yes, no

    def compose(self) -> ComposeResult:
        with Vertical(id="dialog-box"):
            yield Static(shown(self.title_text), id="dialog-title", markup=False)
            yield Static(shown_lines(self.question), id="dialog-body", markup=False)
            with Horizontal(id="dialog-buttons"):
                yield Button(f"{self.yes} (y)", id="yes", variant="warning")
                yield Button(f"{self.no} (n)", id="no", variant="primary")

    def on_button_pressed(self, event: Button.Pressed) -> None:
        self.dismiss(event.button.id == "yes")

    def action_answer(self, value: bool) -> None:
        self.dismiss(value)


class MessageDialog(ModalScreen[None]):
    """What went wrong, why, and what to do; any of enter/escape closes it."""

    BINDINGS = [Binding("escape,enter,q", "close", "Close")]
    AUTO_FOCUS = "#ok"

    def __init__(self, title: str, message: str, hint: str = "", error: bool = True) -> None:
        super().__init__(classes="dialog" + (" -error" if error else ""))
        self.title_text, self.message, self.hint = title, message, hint

    def compose(self) -> ComposeResult:
        with Vertical(id="dialog-box"):
            yield Static(shown(self.title_text), id="dialog-title", markup=False)
            yield Static(shown_lines(self.message), id="dialog-body", markup=False)
            if self.hint:
                yield Static(shown(f"→ {self.hint}"), id="dialog-hint", markup=False)
            with Horizontal(id="dialog-buttons"):
                yield Button("OK", id="ok", variant="primary")

    def on_button_pressed(self, event: Button.Pressed) -> None:
        self.dismiss(None)

    def action_close(self) -> None:
        self.dismiss(None)


class CopyDialog(ModalScreen[None]):
    """`y`: the command (and the tensor under the cursor) shown whole and copied to the clipboard with OSC 52;
    a terminal without OSC 52 copies nothing, so the text stays on screen to select by hand."""

    BINDINGS = [
        Binding("y,c", "copy('command')", "Copy command"),
        Binding("n", "copy('name')", "Copy name"),
        Binding("escape,enter,q", "close", "Close"),
    ]
    AUTO_FOCUS = "#ok"

    def __init__(self, command: str, name: str = "") -> None:
        super().__init__(classes="dialog")
        self.command, self.name_text = command, name

    def compose(self) -> ComposeResult:
        with Vertical(id="dialog-box"):
            yield Static("The same conversion on the command line", id="dialog-title", markup=False)
            yield Static(shown(self.command), id="dialog-body", markup=False)
            if self.name_text:
                yield Static(shown(f"tensor under the cursor: {self.name_text}"), id="copy-name", markup=False)
            yield Static(
                "Copied to the clipboard (OSC 52; some terminals and tmux without set-clipboard ignore it: "
                "then select the text above). y copies the command again, n the tensor name.",
                id="dialog-hint",
                markup=False,
            )
            with Horizontal(id="dialog-buttons"):
                yield Button("OK", id="ok", variant="primary")

    def on_mount(self) -> None:
        self.app.copy_to_clipboard(self.command)

    def action_copy(self, what: str) -> None:
        text = self.name_text if what == "name" and self.name_text else self.command
        self.app.copy_to_clipboard(text)
        self.notify(f"Copied the {'tensor name' if text is self.name_text else 'command'}.", timeout=2)

    def on_button_pressed(self, event: Button.Pressed) -> None:
        self.dismiss(None)

    def action_close(self) -> None:
        self.dismiss(None)


class NameDialog(ModalScreen[str | None]):
    """The name to save the selection under (enter saves, escape does not); the names already saved are listed,
    and typing one of them replaces it."""

    BINDINGS = [Binding("escape", "close", "Cancel")]
    AUTO_FOCUS = "#selection-name"

    def __init__(self, count: int, saved: list[str]) -> None:
        super().__init__(classes="dialog")
        self.count, self.saved = count, saved

    def compose(self) -> ComposeResult:
        with Vertical(id="dialog-box"):
            count = plural(self.count, "tensor")
            yield Static(f"Name this selection ({count})", id="dialog-title")
            yield Input(id="selection-name", placeholder="stage 1, expert 3, TP shard 0…", compact=True)
            said = ", ".join(shown(n) for n in self.saved) if self.saved else "none yet"
            yield Static(
                f"Saved for this checkpoint: {said}. The Export form's Selection field offers them.",
                id="dialog-hint",
                markup=False,
            )

    def on_input_submitted(self, event: Input.Submitted) -> None:
        self.dismiss(event.value)

    def action_close(self) -> None:
        self.dismiss(None)
