"""The summary card: what this checkpoint is, in one screenful."""

from __future__ import annotations

from rich.console import Group
from rich.table import Table
from rich.text import Text

from inspector.scan.model import Checkpoint, Kind
from inspector.scan.summary import contents_rows, parameter_count, summary_rows
from inspector.tui.fmt import KIND_STYLE, count, in_words, shown, size
from inspector.tui.widgets.auto_height import AutoHeightStatic
from inspector.tui.widgets.findings import findings_renderable

# shown elsewhere on the overview: the path and tag in the header, the module copy in the contents table
_NOT_IN_CARD = {"root", "tag", "module_copy"}
_CONTENTS_STYLE = {**{str(k): style for k, style in KIND_STYLE.items()}, "moment": "blue"}


def parameters_text(ckpt: Checkpoint) -> Text:
    """The exact parameter total, then in words from a million up: `2,011,987 (2.0 million)`."""
    n = parameter_count(ckpt)
    words = in_words(n)
    return Text.assemble(f"{n:,}", (f" ({words})" if words else "", "dim"))


def summary_table(ckpt: Checkpoint, saved: str = "") -> Table:
    """The card's left column: the core's summary rows, plus the parameter total and, when known, how long
    ago the tag was saved (`saved`, already in words: the app owns the clock)."""
    t = Table.grid(padding=(0, 2))
    t.add_column(style="bold", no_wrap=True)
    t.add_column()
    for row in summary_rows(ckpt, short_dtypes=True):
        if row.key not in _NOT_IN_CARD:
            t.add_row(row.label, Text(shown(row.value)))
        if row.key == "dtypes":
            t.add_row("Parameters", parameters_text(ckpt))
        if row.key == "training" and saved:
            t.add_row("Saved", saved)
    return t


def contents_table(ckpt: Checkpoint) -> Table:
    """Counts and bytes by kind: masters, moments, the 16-bit copy, frozen, buffers, padding."""
    t = Table(box=None, padding=(0, 1), show_edge=False, header_style="dim")
    t.add_column("what")
    t.add_column("tensors", justify="right")
    t.add_column("params", justify="right")
    t.add_column("bytes", justify="right")
    for row in contents_rows(ckpt, short_dtypes=True):
        nbytes = "(alias)" if row.key == str(Kind.TIED) else ""
        t.add_row(
            Text(row.what, style=_CONTENTS_STYLE.get(row.key, "dim")),
            "" if row.tensors is None else str(row.tensors),
            "" if row.numel is None else count(row.numel),
            nbytes if row.nbytes is None else size(row.nbytes),
        )
    return t


class SummaryCard(AutoHeightStatic):
    """Stage, ranks, dtypes, optimizer, version, steps, loss scale and contents by kind."""

    DEFAULT_CSS = "SummaryCard { height: auto; }"

    _ckpt: Checkpoint | None = None
    _saved = ""

    def show(self, ckpt: Checkpoint, saved: str = "") -> None:
        """Draw `ckpt`; `saved` says how long ago its tag was saved ("3 hours ago"), "" if unknown."""
        self._ckpt, self._saved = ckpt, saved
        self._draw()

    def forget(self, text: str) -> None:
        """No checkpoint: `text` instead (a resize must not draw the previous one again)."""
        self._ckpt = None
        self.update(text)

    def on_resize(self) -> None:
        self._draw()  # one column below 100 cells, two above: decided by the size we really have

    def _draw(self) -> None:
        ckpt = self._ckpt
        if ckpt is None:
            return
        if self.app.size.width < 100:
            self.update(Group(summary_table(ckpt, self._saved), Text(""), contents_table(ckpt)))
            return
        grid = Table.grid(padding=(0, 3))
        grid.add_column()
        grid.add_column()
        grid.add_row(summary_table(ckpt, self._saved), contents_table(ckpt))
        self.update(grid)


class FindingsView(AutoHeightStatic):
    """Findings, errors first, each with what to do; red when anything is wrong."""

    DEFAULT_CSS = "FindingsView { height: auto; }"

    def show(self, ckpt: Checkpoint) -> None:
        self.set_class(bool(ckpt.errors), "-errors")
        self.update(
            findings_renderable(
                ckpt.findings, ok="No problems found: every rank file is present, complete and from one run."
            )
        )
