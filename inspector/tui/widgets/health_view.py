"""The Health tab's pieces: the sortable table of streams, the per-layer bars and the findings.

Everything shown comes from `inspector.health` (rows, roll-ups, findings, sibling ratios); these widgets only
order and draw it. Tensor names come from files: they reach the screen through `shown` only.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from rich.console import RenderableType
from rich.text import Text
from textual.binding import Binding
from textual.coordinate import Coordinate
from textual.message import Message
from textual.widgets import DataTable

from inspector.health import ModuleRollup, Row
from inspector.health.findings import Siblings
from inspector.health.report import natural_key, overview, short
from inspector.tui.fmt import bar, count, shown
from inspector.tui.widgets.short_names import differing as _differing
from inspector.tui.widgets.short_names import elide as _elide
from inspector.tui.widgets.short_names import elide_all, since_heading

SOURCE_SHORT = {
    "master": "master",
    "module": "16-bit",
    "exp_avg": "m",
    "exp_avg_sq": "v",
    "frozen": "frozen",
    "buffer": "buffer",
}
SOURCE_LONG = {  # the row detail spells out the src column's short labels, in torch's and DeepSpeed's names
    "master": "master (fp32)",
    "module": "16-bit (module copy)",
    "exp_avg": "m (Adam exp_avg)",
    "exp_avg_sq": "v (Adam exp_avg_sq)",
}
# --- sorting --------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Entry:
    """One row of the table: a stream's statistics and, once the pass is complete, its sibling ratio."""

    row: Row
    order: int  # position in the checkpoint (natural order)
    siblings: Siblings | None = None

    @property
    def bad(self) -> int:
        return self.row.stats.nan + self.row.stats.inf

    @property
    def ratio(self) -> float | None:
        return self.siblings.ratio if self.siblings else None

    @property
    def spread(self) -> float:
        """How far from its siblings, either way: 40x above and 1/40 below both read 40."""
        r = self.ratio
        if r is None:
            return 0.0
        return math.inf if r == 0 else max(r, 1 / r)


def _desc(v: float | None) -> float:
    """Largest first; NaN and missing last."""
    return -v if v is not None and not math.isnan(v) else math.inf


SORTS: dict[str, tuple[str, Callable[[Entry], tuple[float, ...]]]] = {
    "problems": ("NaN/Inf, then distance from siblings", lambda e: (-e.bad, -e.spread, e.order)),
    "norm": ("L2 norm", lambda e: (_desc(e.row.stats.norm), e.order)),
    "change": ("change since the other tag, relative", lambda e: (_desc(e.row.delta_rel), e.order)),
    "siblings": ("distance from the siblings' median", lambda e: (-e.spread, e.order)),
    "name": ("checkpoint order", lambda e: (e.order,)),
}
SORT_ORDER = tuple(SORTS)
# the column whose header sorts by it (DataTable column keys)
COLUMN_SORT = {
    "nan": "problems",
    "norm": "norm",
    "delta": "change",
    "sib": "siblings",
    "name": "name",
}


class HealthTable(DataTable[RenderableType]):
    """Every stream of the pass, one row each; `s` or a click on a header sorts, enter opens the tensor."""

    BINDINGS = [
        Binding("s", "cycle_sort", "Sort"),
        Binding("enter", "open", "Open tensor", show=True),
        Binding("j", "cursor_down", "Down", show=False),
        Binding("k", "cursor_up", "Up", show=False),
        Binding("g", "first", "First", show=False),
        Binding("G", "last", "Last", show=False),
    ]

    @dataclass
    class Open(Message):
        """Enter on a row: show this tensor in the Tensors tab."""

        name: str

    @dataclass
    class Sorted(Message):
        how: str

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id, cursor_type="row", zebra_stripes=True)
        self.entries: list[Entry] = []
        self._shown_as: dict[str, str] = {}  # full name -> as the name column shows it
        self._alike: dict[str, set[str]] = {}  # as _elide alone shows it -> the names that read so
        self._rows_of: dict[str, list[int]] = {}  # full name -> its rows (one per stream: master, m, v…)
        self.order_by = "problems"

    # (label, key, width) after the name; the name column takes the rest of the table's width, elided from the
    # left (`…o_proj.weight`) so the part that tells rows apart stays; the row detail below spells it whole
    # (80 columns leave the name 24 cells: `m.l.13.m.down_proj.weight` keeps its layer)
    COLUMNS = (
        ("src", "src", 6),
        ("NaN/Inf", "nan", 7),
        ("zeros", "zeros", 5),
        ("norm", "norm", 9),
        ("×sibl", "sib", 6),
        ("Δ/norm", "delta", 7),
    )
    MIN_NAME = 16

    def on_mount(self) -> None:
        self._name_width = self._room()
        self._add_columns()

    def _room(self) -> int:
        fixed = sum(w + 2 * self.cell_padding for _label, _key, w in self.COLUMNS) + 2 * self.cell_padding
        return max(self.MIN_NAME, (self.size.width or 80) - fixed - 2)  # 2: the vertical scrollbar

    def _add_columns(self) -> None:
        """The column the rows are sorted by is underlined (NaN/Inf for the default order, problems first): a
        mark that takes no cell, so narrow columns keep their whole label."""
        mark = {how: key for key, how in COLUMN_SORT.items()}[self.order_by]

        def label(text: str, key: str) -> Text:
            return Text(text, style="bold underline" if key == mark else "")

        self.add_column(label("tensor", "name"), width=self._name_width, key="name")
        for text, key, width in self.COLUMNS:
            self.add_column(label(text, key), width=width, key=key)

    def on_resize(self) -> None:
        room = self._room()
        if room != self._name_width:
            self._name_width = room
            self._rebuild()

    def reset(self) -> None:
        self.entries = []
        self._shown_as, self._alike, self._rows_of = {}, {}, {}
        self.clear()

    def append(self, rows: Sequence[Row], order: dict[str, int]) -> None:
        """Rows as they stream in: added at the end (sorting under the cursor would move it mid-read)."""
        for r in rows:
            e = Entry(r, order.get(r.name, len(order)))
            self.entries.append(e)
            self._add(e, len(self.entries) - 1)
            self._tell_apart(shown(r.name))

    def _tell_apart(self, name: str) -> None:
        """A streamed row whose name reads like an earlier one's: both groups' cells shown with the parts
        that differ (the whole table is fitted again on every rebuild)."""
        same = self._alike.setdefault(_elide(name, self._name_width), set())
        same.add(name)
        if len(same) < 2:
            return
        keep = _differing(same)
        for other in same:
            text = _elide(other, self._name_width, keep)
            if self._shown_as.get(other) != text:
                self._shown_as[other] = text
                for i in self._rows_of.get(other, ()):
                    self.update_cell(str(i), "name", Text(text))

    def complete(self, ratios: dict[tuple[str, str], Siblings]) -> None:
        """The pass is done: sibling ratios are known; sort by the chosen order."""
        self.entries = [Entry(e.row, e.order, ratios.get((e.row.name, e.row.source))) for e in self.entries]
        self.resort()

    def resort(self) -> None:
        self.entries.sort(key=SORTS[self.order_by][1])
        self._rebuild()
        self.post_message(self.Sorted(self.order_by))

    def _rebuild(self) -> None:
        """Rows again (after a sort or a new width), the cursor kept on the same stream."""
        current = self._current_index()
        self.clear(columns=True)
        self._add_columns()
        names = [shown(e.row.name) for e in self.entries]
        self._shown_as, self._alike, self._rows_of = elide_all(names, self._name_width), {}, {}
        for n in dict.fromkeys(names):
            self._alike.setdefault(_elide(n, self._name_width), set()).add(n)
        for i, e in enumerate(self.entries):
            self._add(e, i)
        if current is not None:
            self._move_to(current)

    def action_first(self) -> None:
        self.move_cursor(row=0)

    def action_last(self) -> None:
        self.move_cursor(row=max(self.row_count - 1, 0))

    def find(self, pattern: re.Pattern[str]) -> bool:
        """The cursor on the first row (as shown, sorted) whose tensor name matches; False when none does."""
        for row in range(self.row_count):
            key = self.coordinate_to_cell_key(Coordinate(row, 0)).row_key.value
            if key is not None and pattern.search(self.entries[int(key)].row.name):
                self.move_cursor(row=row)
                return True
        return False

    def entry_at_cursor(self) -> Entry | None:
        if not self.entries or self.cursor_row < 0 or self.cursor_row >= self.row_count:
            return None
        key = self.coordinate_to_cell_key(Coordinate(self.cursor_row, 0)).row_key.value
        return self.entries[int(key)] if key is not None else None

    def _current_index(self) -> tuple[str, str] | None:
        e = self.entry_at_cursor()
        return (e.row.name, e.row.source) if e else None

    def _move_to(self, which: tuple[str, str]) -> None:
        for i, e in enumerate(self.entries):
            if (e.row.name, e.row.source) == which:
                self.move_cursor(row=i, animate=False)
                return

    def _add(self, e: Entry, i: int) -> None:
        st = e.row.stats
        red = "bold red"
        zeros = (
            f"{st.zeros / st.numel:.0%}" if st.numel and st.zeros else "0%"  # one unit in the column
        )  # zero rows: in the detail line
        ratio = e.ratio
        far = ratio is not None and (ratio >= 10 or ratio <= 0.1)
        name = shown(e.row.name)
        self._rows_of.setdefault(name, []).append(i)
        if name not in self._shown_as:
            self._shown_as[name] = _elide(name, self._name_width)
        self.add_row(
            Text(self._shown_as[name]),
            Text(SOURCE_SHORT.get(e.row.source, e.row.source), style="dim"),
            Text(f"{count(st.nan)}/{count(st.inf)}", style=red if st.nan or st.inf else "dim"),
            Text(zeros, style="yellow" if st.all_zero or st.zero_rows else ""),
            Text(short(st.norm), justify="right"),
            Text("–" if ratio is None else f"{ratio:.3g}×", style="yellow" if far else "", justify="right"),
            Text(short(e.row.delta_rel), justify="right"),
            key=str(i),
        )

    def action_cycle_sort(self) -> None:
        self.order_by = SORT_ORDER[(SORT_ORDER.index(self.order_by) + 1) % len(SORT_ORDER)]
        self.resort()

    def on_data_table_header_selected(self, event: DataTable.HeaderSelected) -> None:
        event.stop()
        how = COLUMN_SORT.get(str(event.column_key.value))
        if how:
            self.order_by = how
            self.resort()

    def action_open(self) -> None:
        e = self.entry_at_cursor()
        if e is not None:
            self.post_message(self.Open(e.row.name))

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:  # a click or enter
        event.stop()
        self.action_open()


# --- details, findings and bars -------------------------------------------------------------------------------


def row_detail(e: Entry) -> Text:
    """Every statistic of the highlighted stream, on a few lines."""
    r, st = e.row, e.row.stats
    t = Text()
    t.append(shown(r.name), style="bold")
    t.append(
        f"  {SOURCE_LONG.get(r.source, r.source)} · {r.dtype} · {'×'.join(map(str, r.shape)) or 'scalar'}\n"
    )
    t.append(
        f"min {short(st.minimum)}  max {short(st.maximum)}  |max| {short(st.absmax)}  mean {short(st.mean)}  "
        f"std {short(st.std)}  norm {short(st.norm)}\n"
    )
    bits = [f"{st.numel:,} values", f"{st.zeros:,} zeros"]
    if st.nan or st.inf:
        bits.append(f"{st.nan:,} NaN, {st.pos_inf:,} +Inf, {st.neg_inf:,} −Inf")
    if st.zero_rows is not None:
        bits.append(f"{st.zero_rows:,} rows all zero")
    if r.module_max_diff is not None:
        bits.append(
            f"largest |16-bit − cast master| {short(r.module_max_diff)} ({r.module_differing or 0:,} differ)"
        )
    if r.delta_norm is not None:
        bits.append(f"change {short(r.delta_norm)} ({short(r.delta_rel)} of its norm)")
    if e.siblings is not None:
        bits.append(f"{e.siblings.ratio:.3g}× the median of {e.siblings.count} siblings")
    t.append(" · ".join(bits), style="dim")
    return t


def layer_rows(modules: Sequence[ModuleRollup]) -> list[ModuleRollup]:
    """One roll-up per outermost numbered block (`model.layers.7`, not `model.layers.7.experts.1`), in depth
    order: the masters where the checkpoint has them, else the frozen weights (a fully frozen model still has
    layers to compare). The blocks are the report's own `overview`, less the modules outside any block."""
    blocks = [m for m in overview(modules) if m.module.rpartition(".")[2].isdigit()]
    for source in ("master", "frozen", "module"):
        out = [m for m in blocks if m.source == source]
        if out:
            return sorted(out, key=lambda m: natural_key(m.module))
    return []


def _bar(v: float | None, top: float, width: int) -> Text:
    if v is None:
        return Text("–".ljust(width), style="dim")
    if not math.isfinite(v):
        return Text(("nan" if math.isnan(v) else "inf").ljust(width), style="bold red")
    return Text(bar(v / top if top > 0 else 0.0, width), style="cyan")


def layer_chart(layers: Sequence[ModuleRollup], width: int, against: str | None) -> Text:
    """Norm (and, with a comparison, change) by depth, one bar per layer: a layer that stands out is seen before
    it is read. Bars scale to the largest finite value of their column; the figure follows the bar."""
    if not layers:
        return Text("No numbered layers (model.layers.N…) to chart.", style="dim")
    labels = _labels([m.module for m in layers])
    label_w = min(max(len(v) for v in labels.values()), 28)
    with_delta = against is not None
    cols = 2 if with_delta else 1
    bad_w = max((len(f"  {m.nan + m.inf:,} NaN/Inf") for m in layers if m.nan + m.inf), default=0)
    room = max(width - label_w - 1 - cols * 10 - bad_w, cols * 4)
    bar_w = room // cols
    norms = [m.norm for m in layers if math.isfinite(m.norm)]
    deltas = [m.delta_norm for m in layers if m.delta_norm is not None and math.isfinite(m.delta_norm)]
    top_n, top_d = max(norms, default=0.0), max(deltas, default=0.0)
    out = Text()
    head = "norm".ljust(bar_w + 10)
    if with_delta:
        head += since_heading(shown(against), bar_w + 9)
    out.append(" " * (label_w + 1) + head + "\n", style="bold")
    for m in layers:
        bad = m.nan + m.inf
        out.append(labels[m.module][-label_w:].rjust(label_w) + " ", style="bold red" if bad else "")
        out.append_text(_bar(m.norm, top_n, bar_w))
        out.append(f" {short(m.norm):>8} ")
        if with_delta:
            out.append_text(_bar(m.delta_norm, top_d, bar_w))
            out.append(f" {short(m.delta_norm):>8}")
        if bad:
            out.append(f"  {bad:,} NaN/Inf", style="bold red")
        out.append("\n")
    out.rstrip()
    return out


def _label(module: str) -> str:
    """`model.layers.7` -> `layers.7`: the stack's name and the depth are what tell bars apart."""
    parts = shown(module).split(".")
    return ".".join(parts[-2:])


def _labels(modules: Sequence[str]) -> dict[str, str]:
    """Each module's `_label`, told apart where two blocks share one: two MoE layers' `deepspeed_experts.0` become
    `moe…deepspeed_experts.0` and `moe2…deepspeed_experts.0`; the whole name when even that is shared."""
    short = {m: _label(m) for m in modules}
    seen = Counter(short.values())
    out = {m: s if seen[s] == 1 else f"{shown(m).split('.')[0]}…{s}" for m, s in short.items()}
    again = Counter(out.values())
    return {m: s if again[s] == 1 else shown(m) for m, s in out.items()}
