"""`?`: every key of the app, by screen."""

from __future__ import annotations

from rich.markup import escape
from rich.table import Table
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static

KEYS: list[tuple[str, list[tuple[str, str]]]] = [
    (
        "Everywhere",
        [
            ("? / f1", "this help: the keys of the screen you are on first"),
            ("ctrl+p", "command palette: every action, themes"),
            ("q", "quit (asks while a conversion runs)"),
            ("o t h", "overview, tensors, health tab (h also starts the check)"),
            ("[ ]", "previous / next tag (newest marked ★)"),
            ("r", "choose among several checkpoint roots"),
            ("e / c", "export options with live preflight / convert the selection"),
            ("m", "name what e would export; kept for this checkpoint between runs"),
            ("p", "selections: per stage, expert, TP split, frozen, LoRA, and yours; enter selects, d removes"),
            ("y", "show and copy the same `zero-inspector convert …` command"),
        ],
    ),
    (
        "Overview",
        [
            ("↑ ↓ pgup pgdn home end", "scroll (the overview has the keys from launch)"),
        ],
    ),
    (
        "Tensors",
        [
            ("↑ ↓ j k g G", "move; first / last row"),
            ("← → enter", "fold / unfold a submodule (→ on an open one steps in)"),
            ("space / v", "select a tensor or a submodule (or click its □); v v: a range in the flat table"),
            ("a / n / i", "select all / none / invert (of what the filter shows)"),
            ("/", "filter: glob (*.q_proj.*), regex or text; e exports what it shows; ↓ to the list, ↑ history"),
            ("escape", "clear the filter, or cancel statistics"),
            ("s", "statistics of the tensor under the cursor (min, max, NaN, histogram)"),
            ("f", "flat table instead of the tree; S or a header sorts (twice: reversed)"),
        ],
    ),
    (
        "Health",
        [
            ("h", "start the check (again after a cancel); a result is kept per tag"),
            ("escape", "cancel the check (what was read stays on screen)"),
            ("↑ ↓ j k g G", "move; first / last row"),
            ("/", "find a tensor's row (glob, regex or text); enter keeps it"),
            ("s / click a header", "sort: NaN/Inf first, norm, change, siblings, name"),
            ("enter", "open the tensor in the Tensors tab"),
            ("a", "compare with another tag"),
        ],
    ),
    (
        "Export options",
        [
            ("tab / shift+tab", "next / previous field (in a field, letters are typed)"),
            ("c / ctrl+s", "convert with these options (ctrl+s also while typing)"),
            ("escape", "back"),
        ],
    ),
    (
        "Convert",
        [
            ("escape", "cancel (after confirmation)"),
            ("v", "verify the output byte for byte (when finished)"),
            ("b", "back to the checkpoint (when finished)"),
        ],
    ),
]


NOTES = {"Everywhere": "except in a text field: escape leaves it first"}


def keys_table(here: str = "") -> Table:
    """Every key by screen, the screen `here` first (then the global keys): at 80x24 what you need now is on
    the first page."""
    t = Table(box=None, padding=(0, 2), show_header=False)
    t.add_column(style="bold cyan", no_wrap=True)
    t.add_column()
    order = sorted(KEYS, key=lambda kv: (kv[0] != here, kv[0] != "Everywhere"))
    for section, rows in order:
        title = f"{section} (this screen)" if section == here else section
        t.add_row(f"[bold underline]{title}[/]", f"[dim]{NOTES.get(section, '')}[/]")
        for key, what in rows:
            t.add_row(escape(key), escape(what))
        t.add_row("", "")
    return t


class HelpBox(VerticalScroll):
    """The scrolling list of keys; its bottom border says whether more is below and how to get there."""

    def on_mount(self) -> None:
        self.border_title = "zero-inspector keys"
        self.watch(self, "scroll_y", self._say_where, init=False)
        self.watch(self, "virtual_size", self._say_where, init=False)
        self._say_where()

    def on_resize(self) -> None:
        self._say_where()

    def _say_where(self, _: object = None) -> None:
        seen = round(100 * self.scroll_y / self.max_scroll_y) if self.max_scroll_y > 0 else 100
        if self.max_scroll_y <= 0:
            where = "escape closes"
        elif seen >= 100:
            where = "end · ↑ pgup scroll back · escape closes"
        else:
            where = "▼ more below · ↓ pgdn scroll · escape closes"
        self.border_subtitle = where


class HelpScreen(ModalScreen[None]):
    BINDINGS = [Binding("escape,q,question_mark", "dismiss", "Close")]

    def __init__(self, here: str = "") -> None:
        super().__init__()
        self.here = here  # the KEYS section of the screen help was asked on

    def compose(self) -> ComposeResult:
        with HelpBox(id="help-box"):
            yield Static(keys_table(self.here))

    async def action_dismiss(self, result: object = None) -> None:
        self.dismiss(None)
