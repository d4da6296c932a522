"""Ranks view: each rank's files, sizes and partition/padding per group, with a bar per rank."""

from __future__ import annotations

import os

from rich.table import Table
from rich.text import Text
from textual import events

from inspector.scan.model import Checkpoint, FileInfo
from inspector.scan.summary import RankRow, alignment_padding, rank_row
from inspector.tui.fmt import bar, plural, shown, size
from inspector.tui.widgets.auto_height import AutoHeightStatic

OTHERS_NAMED = 4  # the `+` row names this many files, then counts the rest
MAX_ROWS = 64  # beyond this, the first and last ranks and the outliers are shown


def _shown(rows: list[RankRow]) -> list[int]:
    n = len(rows)
    if n <= MAX_ROWS:
        return list(range(n))
    odd = sorted(range(n), key=lambda i: (-rows[i].padding, -abs(rows[i].nbytes - rows[0].nbytes)))[:8]
    return sorted(set(range(4)) | set(range(n - 4, n)) | set(odd))


def ranks_table(ckpt: Checkpoint, bar_width: int = 16, *, whole_names: bool = False) -> Table:
    """`whole_names` lists a rank's files one per line, folded rather than cut (wide terminals); otherwise
    they share one line, cut with `…` (the narrow layout, where a folded name would take many rows)."""
    t = Table(box=None, padding=(0, 1), header_style="dim", expand=True)
    t.add_column("rank", justify="right", no_wrap=True, min_width=4)
    t.add_column("size", justify="right", no_wrap=True, min_width=10)
    t.add_column("share", no_wrap=True, min_width=bar_width)
    for g in ckpt.groups:
        t.add_column(f"g{g.index} stored/pad", justify="right", no_wrap=True, min_width=14)
    if whole_names:
        t.add_column("files", overflow="fold", ratio=1)
    else:
        t.add_column("files", overflow="ellipsis", no_wrap=True, ratio=1)
    rows = [rank_row(r) for r in ckpt.ranks]
    others = _other_files(ckpt, rows)
    t.caption = _legend(ckpt, bool(alignment_padding(ckpt)), bool(others))
    t.caption_justify = "left"
    t.caption_style = "dim"
    biggest = max((row.nbytes for row in rows), default=1) or 1
    prev = -1
    for i in _shown(rows):
        if prev >= 0 and i != prev + 1:
            t.add_row("…", "", Text(f"{plural(i - prev - 1, 'rank')} like these", style="dim"))
        prev = i
        row = rows[i]
        share = Text(bar(row.nbytes / biggest, bar_width), style="green" if row.complete else "red")
        if row.padding:
            share.append(f" {row.padding} pad", style="yellow")
        cells = [Text(cell, style="" if cell.endswith("/ 0") else "yellow") for cell in row.group_cells]
        cells += [Text("")] * (len(ckpt.groups) - len(cells))
        sep = "\n" if whole_names else ", "
        files = Text(
            sep.join(shown(f) for f in row.files) or "MISSING", style="dim" if row.complete else "red"
        )
        t.add_row(str(row.rank), size(row.nbytes), share, *cells, files)
    if others:  # expert and pipeline-layer files: the overview counts them, so the table lists them
        names = [shown(os.path.basename(f.path)) for f in others[:OTHERS_NAMED]]
        if len(others) > OTHERS_NAMED:
            names.append(f"… {len(others) - OTHERS_NAMED} more")
        listed = ("\n" if whole_names else ", ").join(names)
        blank = [Text("")] * len(ckpt.groups)
        t.add_row(
            "+",
            size(sum(f.size for f in others)),
            Text(plural(len(others), "file"), style="dim"),
            *blank,
            Text(listed, style="dim"),
        )
    return t


def _legend(ckpt: Checkpoint, aligned: bool, others: bool) -> str:
    """What the columns mean (the gN headings were unexplained): the optimizer's parameter groups, a blank cell
    where a rank holds none of that group (an expert-parallel rank, a pipeline stage), and the `+` row."""
    bits = []
    if ckpt.groups:
        pad = (
            " (end of the group + alignment between parameters, param_alignment_paddings)" if aligned else ""
        )
        bits.append(f"gN: optimizer group N, elements stored / padding{pad}; blank: none held")
    if others:
        bits.append("+: the tag's other files (experts' or layers' model states)")  # counted in Files
    return "\n".join(bits)


def _other_files(ckpt: Checkpoint, rows: list[RankRow]) -> list[FileInfo]:
    """The tag's files no rank row lists (expert and pipeline-layer model states)."""
    listed = {name for row in rows for name in row.files}
    return [f for f in ckpt.files if os.path.basename(f.path) not in listed]


WIDE = 100  # from this width, file names are shown whole (one per line) and the bar gives them room
BAR_ROOM = 150  # from this width, the full 16-cell bar fits beside whole names


class RanksView(AutoHeightStatic):
    """One row per rank (outliers kept when there are hundreds): where the bytes and the padding are. Laid out
    again when the terminal is resized across `WIDE` or `BAR_ROOM`: at 120 columns the rank files' names are
    whole, not cut mid-word."""

    DEFAULT_CSS = "RanksView { height: auto; }"

    def __init__(self, content: str = "") -> None:
        super().__init__(content)
        self._ckpt: Checkpoint | None = None
        self._shape: tuple[bool, int] | None = None

    def show(self, ckpt: Checkpoint) -> None:
        self._ckpt, self._shape = ckpt, None
        self._relayout(self.size.width or self.app.size.width)

    def forget(self) -> None:
        self._ckpt, self._shape = None, None
        self.update("")

    def on_resize(self, event: events.Resize) -> None:
        self._relayout(event.size.width)

    def _relayout(self, width: int) -> None:
        if self._ckpt is None:
            return
        shape = (width >= WIDE, 16 if width >= BAR_ROOM or width < WIDE else 8)
        if shape != self._shape:
            self._shape = shape
            self.update(ranks_table(self._ckpt, shape[1], whole_names=shape[0]))
