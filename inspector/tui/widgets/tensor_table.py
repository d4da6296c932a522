"""The flat tensor table (`f` on the Tensors tab): every tensor the filter shows, one row each, sortable by size,
dtype, rank count or name (`S`, or a click on a header; a second click reverses), beside the module tree and
sharing its selection. The name comes first, as wide as the pane leaves it, its middle elided, never its end;
the size is the next column, so it is always in view."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from rich.text import Text
from textual.binding import Binding
from textual.coordinate import Coordinate
from textual.message import Message
from textual.widgets import DataTable

from inspector.scan.model import TensorInfo
from inspector.tui.fmt import KIND_STYLE, dtype, shape, shown, size
from inspector.tui.widgets.short_names import elide_all

# sort name -> (label said, key over (tensor, out bytes, rank count)); sizes and rank counts largest first
SORTS: dict[str, tuple[str, Callable[[TensorInfo, int, int], tuple[object, ...]]]] = {
    "size": ("size, largest first", lambda t, out, ranks: (-out, t.name)),
    "dtype": ("dtype", lambda t, out, ranks: (t.dtype, -out, t.name)),
    "ranks": ("rank count, most first", lambda t, out, ranks: (-ranks, -out, t.name)),
    "name": ("name", lambda t, out, ranks: (t.name,)),
}
COLUMN_SORT = {"size": "size", "dtype": "dtype", "ranks": "ranks", "name": "name"}
COLUMNS = (("", "mark"), ("tensor", "name"), ("out", "size"), ("dtype", "dtype"), ("ranks", "ranks"))
MORE = (("kind", "kind"), ("shape", "shape"))
MIN_NAME = 16  # below this the name alone is cut; the other columns scroll instead


class TensorTable(DataTable[Text]):
    """Rows keyed by tensor name; the pane gives it the tensors, the selection and the byte counts."""

    BINDINGS = [
        Binding("space", "toggle_select", "Select"),
        Binding("S", "cycle_sort", "Sort"),
        Binding("v", "range", "Range", show=False),  # in ? help; the 80-column key bar keeps c Convert
        Binding("j", "cursor_down", "Down", show=False),
        Binding("k", "cursor_up", "Up", show=False),
        Binding("g", "first", "First", show=False),
        Binding("G", "last", "Last", show=False),
    ]

    @dataclass
    class Toggled(Message):
        name: str

    @dataclass
    class Marked(Message):
        """A range marked with `v`: these rows join the selection."""

        names: tuple[str, ...]

    @dataclass
    class Sorted(Message):
        how: str

    def __init__(self, *, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(id=id, classes=classes, cursor_type="row", zebra_stripes=True)
        self.order_by = "size"
        self.reverse = False  # a second click on the same header turns the order round
        self.range_from: str | None = None  # `v` pressed once: the row a range starts from
        self._fitted = 0  # the width the name column was last fitted to
        self.rows_in: list[tuple[TensorInfo, int, int]] = []  # (tensor, out bytes, rank count)
        self.selected: set[str] = set()

    def on_resize(self) -> None:
        if self.rows_in and self.size.width != self._fitted:
            self.fill(self.rows_in, self.selected)

    def _cells(self, t: TensorInfo, out: int, ranks: int) -> list[Text]:
        on = t.name in self.selected
        return [
            Text("■" if on else "□", style="bold green" if on else "dim"),
            Text(shown(t.name), no_wrap=True),
            Text(size(out), justify="right"),
            Text(dtype(t.dtype)),
            Text(str(ranks), justify="right"),
            Text(str(t.kind), style=KIND_STYLE[t.kind]),
            Text(shape(t.shape)),
        ]

    def _name_width(self, rows: list[list[Text]]) -> int:
        """The cells the name may take: the pane's width less every other column (and their padding)."""
        labels = [label for label, _ in COLUMNS + MORE]
        others = sum(
            max([len(labels[i])] + [r[i].cell_len for r in rows]) for i in range(len(labels)) if i != 1
        )
        room = self.size.width - self.styles.scrollbar_size_vertical - 2 * self.cell_padding * len(labels)
        longest = max([len("tensor")] + [r[1].cell_len for r in rows])
        return min(longest, max(MIN_NAME, room - others))

    def fill(self, rows: list[tuple[TensorInfo, int, int]], selected: set[str]) -> None:
        """Show `rows` in the current order, keeping the cursor on the tensor it was on; the name column
        fitted to the pane's width."""
        self.rows_in, self.selected = rows, selected
        at = self.tensor_at_cursor()
        ordered = sorted(rows, key=lambda r: SORTS[self.order_by][1](*r), reverse=self.reverse)
        cells = [self._cells(*r) for r in ordered]
        width = self._name_width(cells)
        self._fitted = self.size.width
        self.clear(columns=True)
        for label, key in COLUMNS + MORE:
            self.add_column(label, key=key, width=width if key == "name" else None)
        fitted = elide_all([row[1].plain for row in cells], width)  # one rule with the Health tab's names
        for (t, _, _), row in zip(ordered, cells, strict=True):
            row[1] = Text(fitted[row[1].plain], no_wrap=True)
            self.add_row(*row, key=t.name)
        if at is not None and at.name in {t.name for t, _, _ in rows}:
            self.move_cursor(row=self.get_row_index(at.name))

    def tensor_at_cursor(self) -> TensorInfo | None:
        if not self.rows_in or self.cursor_row < 0 or self.cursor_row >= self.row_count:
            return None
        name = self.coordinate_to_cell_key((self.cursor_row, 0)).row_key.value  # type: ignore[arg-type]
        return next((t for t, _, _ in self.rows_in if t.name == name), None)

    def action_toggle_select(self) -> None:
        t = self.tensor_at_cursor()
        if t is not None:
            self.post_message(self.Toggled(t.name))

    def action_range(self) -> None:
        """`v` starts a range at the cursor; `v` again marks every row from there to the cursor (lazygit)."""
        t = self.tensor_at_cursor()
        if t is None:
            return
        if self.range_from is None or self.range_from not in self.rows:
            self.range_from = t.name
            self.notify("Range from here: move and press v again to mark it.", timeout=3, markup=False)
            return
        a, b = sorted((self.get_row_index(self.range_from), self.cursor_row))
        self.range_from = None
        keys = [self.coordinate_to_cell_key(Coordinate(r, 0)).row_key.value for r in range(a, b + 1)]
        self.post_message(self.Marked(tuple(str(k) for k in keys)))

    def action_first(self) -> None:
        self.move_cursor(row=0)

    def action_last(self) -> None:
        self.move_cursor(row=max(self.row_count - 1, 0))

    def sort_by(self, how: str, *, again: bool = False) -> None:
        """Order by `how`; `again` (the same header clicked twice) turns the order round."""
        self.reverse = not self.reverse if again and how == self.order_by else False
        self.order_by = how
        self.fill(self.rows_in, self.selected)
        self.post_message(self.Sorted(how))

    def action_cycle_sort(self) -> None:
        order = list(SORTS)
        self.sort_by(order[(order.index(self.order_by) + 1) % len(order)])

    def on_data_table_header_selected(self, event: DataTable.HeaderSelected) -> None:
        how = COLUMN_SORT.get(str(event.column_key.value))
        if how:
            event.stop()
            self.sort_by(how, again=True)
