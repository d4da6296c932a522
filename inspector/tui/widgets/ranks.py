"""Ranks view: each rank's files, sizes and partition/padding per group, with a bar per rank."""

from __future__ import annotations

import os

from rich.table import Table
from rich.text import Text

from inspector.scan.model import Checkpoint
from inspector.tui.fmt import bar, count, size
from inspector.tui.widgets.auto_height import AutoHeightStatic

MAX_ROWS = 64  # beyond this, the first and last ranks and the outliers are shown


def _shown(ckpt: Checkpoint) -> list[int]:
    n = len(ckpt.ranks)
    if n <= MAX_ROWS:
        return list(range(n))
    sizes = [r.optim_bytes + r.model_bytes for r in ckpt.ranks]
    pads = [sum(g.padding for g in r.groups) for r in ckpt.ranks]
    odd = sorted(range(n), key=lambda i: (-pads[i], -abs(sizes[i] - sizes[0])))[:8]
    return sorted(set(range(4)) | set(range(n - 4, n)) | set(odd))


def ranks_table(ckpt: Checkpoint, bar_width: int = 16) -> Table:
    t = Table(box=None, padding=(0, 1), header_style="dim", expand=True)
    t.add_column("rank", justify="right", no_wrap=True, min_width=4)
    t.add_column("size", justify="right", no_wrap=True, min_width=10)
    t.add_column("share", no_wrap=True, min_width=bar_width)
    for g in ckpt.groups:
        t.add_column(f"g{g.index} stored/pad", justify="right", no_wrap=True, min_width=14)
    t.add_column("files", overflow="ellipsis", no_wrap=True, ratio=1)
    biggest = max((r.optim_bytes + r.model_bytes for r in ckpt.ranks), default=1) or 1
    prev = -1
    for i in _shown(ckpt):
        r = ckpt.ranks[i]
        if prev >= 0 and i != prev + 1:
            t.add_row("…", "", Text(f"{i - prev - 1} ranks like these", style="dim"))
        prev = i
        total = r.optim_bytes + r.model_bytes
        pad = sum(g.padding for g in r.groups)
        sum(g.stored_numel for g in r.groups) or 1
        share = Text(bar(total / biggest, bar_width), style="green" if r.optim_file else "red")
        if pad:
            share.append(f" {pad} pad", style="yellow")
        files = ", ".join(os.path.basename(p) for p in (r.optim_file, r.model_file) if p) or "MISSING"
        cells = [
            Text(f"{count(g.stored_numel)} / {g.padding}", style="yellow" if g.padding else "")
            for g in r.groups
        ]
        cells += [Text("")] * (len(ckpt.groups) - len(cells))
        t.add_row(
            str(r.rank), size(total), share, *cells, Text(files, style="dim" if r.optim_file else "red")
        )
    return t


class RanksView(AutoHeightStatic):
    """One row per rank (outliers kept when there are hundreds): where the bytes and the padding are."""

    DEFAULT_CSS = "RanksView { height: auto; }"

    def show(self, ckpt: Checkpoint) -> None:
        self.update(ranks_table(ckpt))
