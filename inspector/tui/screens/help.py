"""`?`: every key of the app, by screen."""

from __future__ import annotations

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
            ("?", "this help"),
            ("ctrl+p", "command palette: every action, themes"),
            (
                "q",
                "quit (asks while a conversion runs); in a text field (the filter, the export form) q is "
                "typed like any letter: escape leaves the field first",
            ),
            ("o / t", "overview / tensors tab"),
            ("h", "health tab: check every tensor of the tag in the background (NaN, Inf, norms, moments)"),
            ("[ / ]", "previous / next tag (newest marked ★)"),
            ("r", "choose among several checkpoint roots"),
            ("e", "export options (output, dtype, shards, renames) with live preflight"),
            ("c", "convert the selection (asks first if preflight says it won't fit)"),
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
            ("↑ ↓ ← →", "move; ← → fold and unfold submodules"),
            ("enter", "fold / unfold a submodule"),
            ("space", "select or deselect a tensor or a whole submodule (or click its □ mark)"),
            ("a / n / i", "select all / none / invert (of what the filter shows)"),
            (
                "/",
                "filter by name: glob (*.q_proj.*), regex (^model\\.layers\\.[13]\\.: has ^ $ \\ ( ) | + { }) or "
                "text; the line under the tree says which, and how many match",
            ),
            ("escape", "clear the filter, or cancel statistics"),
            ("s", "statistics of the focused tensor (min, max, mean, std, NaN, histogram, diffs)"),
        ],
    ),
    (
        "Health",
        [
            ("h", "start the check (again after a cancel); a finished result is kept per tag"),
            ("escape", "cancel the check (what was read stays on screen)"),
            ("s / click a header", "sort: NaN/Inf first, norm, change, distance from siblings, name (its header underlined)"),
            ("enter", "open the tensor in the Tensors tab, its detail beside it"),
            ("a", "compare with another tag (change of every master; none for the tag alone)"),
        ],
    ),
    (
        "Export options",
        [
            ("tab / shift+tab", "next / previous field"),
            ("c / ctrl+s", "convert with these options (ctrl+s also while typing in a field)"),
            ("escape", "back"),
        ],
    ),
    (
        "Convert",
        [
            ("escape", "cancel (after confirmation; partial output is removed)"),
            ("v", "verify the output byte for byte (when finished)"),
            ("b", "back to the checkpoint (when finished)"),
        ],
    ),
]


NOTES = {"Everywhere": "except in a text field, where letters are typed: escape leaves it"}


def keys_table() -> Table:
    t = Table(box=None, padding=(0, 2), show_header=False)
    t.add_column(style="bold cyan", no_wrap=True)
    t.add_column()
    for section, rows in KEYS:
        t.add_row(f"[bold underline]{section}[/]", f"[dim]{NOTES.get(section, '')}[/]")
        for key, what in rows:
            t.add_row(key, what)
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

    def compose(self) -> ComposeResult:
        with HelpBox(id="help-box"):
            yield Static(keys_table())

    async def action_dismiss(self, result: object = None) -> None:
        self.dismiss(None)
