"""Ranks view: each rank's files, sizes and partition/padding per group, with a bar per rank."""

from __future__ import annotations

from rich.table import Table
from rich.text import Text

from inspector.scan.model import Checkpoint
from inspector.scan.summary import RankRow, alignment_padding, rank_row
from inspector.tui.fmt import bar, plural, shown, size
from inspector.tui.widgets.auto_height import AutoHeightStatic

MAX_ROWS = 64  # beyond this, the first and last ranks and the outliers are shown


def _shown(rows: list[RankRow]) -> list[int]:
    n = len(rows)
    if n <= MAX_ROWS:
        return list(range(n))
    odd = sorted(range(n), key=lambda i: (-rows[i].padding, -abs(rows[i].nbytes - rows[0].nbytes)))[:8]
    return sorted(set(range(4)) | set(range(n - 4, n)) | set(odd))


def ranks_table(ckpt: Checkpoint, bar_width: int = 16) -> Table:
    t = Table(box=None, padding=(0, 1), header_style="dim", expand=True)
    t.add_column("rank", justify="right", no_wrap=True, min_width=4)
    t.add_column("size", justify="right", no_wrap=True, min_width=10)
    t.add_column("share", no_wrap=True, min_width=bar_width)
    for g in ckpt.groups:
        t.add_column(f"g{g.index} stored/pad", justify="right", no_wrap=True, min_width=14)
    t.add_column("files", overflow="ellipsis", no_wrap=True, ratio=1)
    align = alignment_padding(ckpt)
    if align:
        t.caption = "pad: end of the group + alignment between parameters (param_alignment_paddings)"
        t.caption_justify = "left"
        t.caption_style = "dim"
    rows = [rank_row(r) for r in ckpt.ranks]
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
        files = Text(shown(", ".join(row.files)) or "MISSING", style="dim" if row.complete else "red")
        t.add_row(str(row.rank), size(row.nbytes), share, *cells, files)
    return t


class RanksView(AutoHeightStatic):
    """One row per rank (outliers kept when there are hundreds): where the bytes and the padding are."""

    DEFAULT_CSS = "RanksView { height: auto; }"

    def show(self, ckpt: Checkpoint) -> None:
        self.update(ranks_table(ckpt))
