"""The flat tensor table (`f` on the Tensors tab): every tensor the filter shows, one row each, sortable by size,
dtype, rank count or name (`S`, or a click on a header), beside the module tree and sharing its selection."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from rich.text import Text
from textual.binding import Binding
from textual.message import Message
from textual.widgets import DataTable

from inspector.scan.model import TensorInfo
from inspector.tui.fmt import KIND_STYLE, dtype, shape, shown, size

# sort name -> (label said, key over (tensor, out bytes, rank count)); sizes and rank counts largest first
SORTS: dict[str, tuple[str, Callable[[TensorInfo, int, int], tuple[object, ...]]]] = {
    "size": ("size, largest first", lambda t, out, ranks: (-out, t.name)),
    "dtype": ("dtype", lambda t, out, ranks: (t.dtype, -out, t.name)),
    "ranks": ("rank count, most first", lambda t, out, ranks: (-ranks, -out, t.name)),
    "name": ("name", lambda t, out, ranks: (t.name,)),
}
COLUMN_SORT = {"size": "size", "dtype": "dtype", "ranks": "ranks", "name": "name"}


class TensorTable(DataTable[Text]):
    """Rows keyed by tensor name; the pane gives it the tensors, the selection and the byte counts."""

    BINDINGS = [
        Binding("space", "toggle_select", "Select"),
        Binding("S", "cycle_sort", "Sort"),
        Binding("j", "cursor_down", "Down", show=False),
        Binding("k", "cursor_up", "Up", show=False),
        Binding("g", "first", "First", show=False),
        Binding("G", "last", "Last", show=False),
    ]

    @dataclass
    class Toggled(Message):
        name: str

    @dataclass
    class Sorted(Message):
        how: str

    def __init__(self, *, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(id=id, classes=classes, cursor_type="row", zebra_stripes=True)
        self.order_by = "size"
        self.rows_in: list[tuple[TensorInfo, int, int]] = []  # (tensor, out bytes, rank count)
        self.selected: set[str] = set()

    def on_mount(self) -> None:
        # the sortable figures first, the long name last: in a 40-column pane the figures stay in view
        for label, key in (("", "mark"), ("out", "size"), ("dtype", "dtype"), ("ranks", "ranks")):
            self.add_column(label, key=key)
        for label, key in (("kind", "kind"), ("shape", "shape"), ("tensor", "name")):
            self.add_column(label, key=key)

    def fill(self, rows: list[tuple[TensorInfo, int, int]], selected: set[str]) -> None:
        """Show `rows` in the current order, keeping the cursor on the tensor it was on."""
        self.rows_in, self.selected = rows, selected
        at = self.tensor_at_cursor()
        self.clear()
        for t, out, ranks in sorted(rows, key=lambda r: SORTS[self.order_by][1](*r)):
            on = t.name in selected
            self.add_row(
                Text("■" if on else "□", style="bold green" if on else "dim"),
                Text(size(out), justify="right"),
                Text(dtype(t.dtype)),
                Text(str(ranks), justify="right"),
                Text(str(t.kind), style=KIND_STYLE[t.kind]),
                Text(shape(t.shape)),
                Text(shown(t.name), no_wrap=True),
                key=t.name,
            )
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

    def action_first(self) -> None:
        self.move_cursor(row=0)

    def action_last(self) -> None:
        self.move_cursor(row=max(self.row_count - 1, 0))

    def sort_by(self, how: str) -> None:
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
            self.sort_by(how)
