"""Tensors tab: the module tree with selection and filter, the detail panel, statistics on demand."""

from __future__ import annotations

import re
import threading
from typing import Any

from rich.console import RenderableType
from rich.text import Text
from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.widgets import Input, Static, Tree

from inspector.scan.model import Checkpoint, TensorInfo
from inspector.tui.fmt import count, plural, shown, size
from inspector.tui.screens.tensor_stats import StatsUpdate, stream_stats
from inspector.tui.session import ModuleNode, exported, filter_kind, name_filter
from inspector.tui.typed import zi
from inspector.tui.widgets.module_tree import ModuleTree
from inspector.tui.widgets.tensor_detail import TensorDetail
from inspector.tui.widgets.tensor_table import SORTS, TensorTable


class TensorsPane(Horizontal):
    BINDINGS = [
        Binding("slash", "filter", "Filter", key_display="/"),
        Binding("s", "stats", "Stats"),
        Binding("f", "flat", "Flat/tree", show=False),  # in ? help; the 80-column key bar keeps c Convert
        Binding("escape", "escape", "Clear", show=False),
        Binding("down", "leave_filter", "To the list", show=False),  # only while the filter box has focus
        Binding("up", "filter_history", "Earlier filter", show=False),
    ]

    def __init__(self) -> None:
        super().__init__()
        self.ckpt: Checkpoint | None = None
        self._cancel = threading.Event()
        self._stats_for: str | None = None
        self._results: list[RenderableType] = []
        self._history: list[str] = []  # filters entered (enter), oldest first; `up` in the box goes back
        self._back = 0  # how far back `up` has gone

    def on_mount(self) -> None:
        self.watch(self.app, "base_options", lambda _opts: self.refresh_options(), init=False)

    def compose(self) -> ComposeResult:
        with Vertical(id="tree-column"):
            yield Input(
                placeholder="filter: glob *.q_proj.*, regex ^model\\.layers\\.1, or text",
                id="filter",
                classes="-hidden",
            )
            yield ModuleTree(id="module-tree")
            yield TensorTable(id="tensor-table", classes="-hidden")
            yield Static("", id="selection-line")
        with VerticalScroll(id="detail-column"):
            yield TensorDetail(id="detail")

    @property
    def module_tree(self) -> ModuleTree:
        return self.query_one(ModuleTree)

    @property
    def detail(self) -> TensorDetail:
        return self.query_one(TensorDetail)

    @property
    def flat(self) -> TensorTable:
        return self.query_one(TensorTable)

    def focus_tree(self) -> None:
        """The list shown (the tree, or the flat table after `f`) takes the keys."""
        (self.module_tree if self.flat.has_class("-hidden") else self.flat).focus()

    def action_flat(self) -> None:
        """`f`: the flat, sortable table instead of the tree, or back; same filter, same selection."""
        showing = self.flat.has_class("-hidden")
        self.flat.set_class(not showing, "-hidden")
        self.module_tree.set_class(showing, "-hidden")
        if showing:
            self._fill_flat()
        self.focus_tree()

    def _fill_flat(self) -> None:
        if self.ckpt is None or self.flat.has_class("-hidden"):
            return
        tree = self.module_tree
        rows = [(t, tree.out_bytes(t), len(tree.ranks_of(t.name))) for t in tree.shown_tensors()]
        self.flat.fill(rows, zi(self).selected)

    @on(TensorTable.Toggled)
    def _flat_toggled(self, event: TensorTable.Toggled) -> None:
        selected = set(zi(self).selected)
        selected.symmetric_difference_update({event.name})
        self.module_tree.set_selection(selected)  # posts SelectionChanged: the app, the line, the table follow

    @on(TensorTable.Marked)
    def _flat_marked(self, event: TensorTable.Marked) -> None:
        self.module_tree.set_selection(set(zi(self).selected) | set(event.names))
        self.notify(f"{plural(len(event.names), 'row')} marked.", timeout=2, markup=False)

    @on(TensorTable.Sorted)
    def _flat_sorted(self, event: TensorTable.Sorted) -> None:
        turned = " (reversed)" if self.flat.reverse else ""
        self.notify(f"Sorted by {SORTS[event.how][0]}{turned}.", timeout=2, markup=False)

    @on(TensorTable.RowHighlighted)
    def _flat_row(self, event: TensorTable.RowHighlighted) -> None:
        t = self.flat.tensor_at_cursor()
        if t is not None:
            self._show_data(t)

    def show(self, ckpt: Checkpoint) -> None:
        self.cancel_stats()
        self.ckpt = ckpt
        self.module_tree.dedupe_tied = zi(self).base_options.dedupe_tied
        self.module_tree.load(ckpt, zi(self).selected, zi(self).out_dtype())
        self._update_selection_line()
        self._follow_cursor()
        self._fill_flat()

    def clear(self) -> None:
        """Nothing of the previous checkpoint: no tree, no detail, no statistics, no filter."""
        self.cancel_stats()
        self.ckpt = None
        box = self.query_one("#filter", Input)
        with self.prevent(Input.Changed):
            box.value = ""
        box.add_class("-hidden")
        zi(self).shown_only = None
        self.module_tree.unload()
        self.detail.forget()
        self.query_one("#selection-line", Static).update("")

    def refresh_options(self) -> None:
        """Export options changed (dtype): subtotals and the detail's output dtype follow."""
        if self.ckpt is None:
            return
        self.module_tree.out_dtype = zi(self).out_dtype()
        self.module_tree.dedupe_tied = zi(self).base_options.dedupe_tied
        self.module_tree.refresh_labels()
        self.detail.out_dtype = self.module_tree.out_dtype
        self.detail.redraw()
        self._update_selection_line()

    # --- selection ----------------------------------------------------------------------------------------

    @on(ModuleTree.SelectionChanged)
    def _selection(self, event: ModuleTree.SelectionChanged) -> None:
        zi(self).set_selection(event.selected)
        self._update_selection_line()
        self._fill_flat()
        node = self.module_tree.cursor_node
        if node is not None and isinstance(node.data, ModuleNode):  # "selected: k of n" follows the toggle
            self._show_module(node.data)

    def _update_selection_line(self) -> None:
        ckpt = self.ckpt
        if ckpt is None:
            return
        app = zi(self)
        chosen = [t for t in ckpt.tensors if t.name in exported(app.selected, app.shown_only)]
        out = sum(self.module_tree.out_bytes(t) for t in chosen)
        params = sum(t.numel for t in chosen if t.alias_of is None)
        line = Text.assemble(
            (f"{len(chosen)}", "bold"),
            f" of {len(ckpt.tensors)} tensors · {count(params)} params · ",
            (size(out), "bold"),
            " out" + (" · the filter's (what e exports)" if app.shown_only is not None else ""),
        )
        if chosen:
            opts = zi(self).convert_options()
            flags = [f"--include {p}" for p in opts.include] + [f"--exclude {p}" for p in opts.exclude]
            if flags:
                said = " ".join(flags)
                line.append(f"\n= {said if len(said) < 160 else said[:157] + '…'}", style="dim")
        else:
            line.append("  (nothing selected: space, a)", style="yellow")
        self.query_one("#selection-line", Static).update(Text.assemble(self._filter_line(), line))

    def _filter_line(self) -> Text:
        """While a filter is on: how its text was read and how many tensors it matches (a word, never an
        empty tree with no explanation)."""
        box = self.query_one("#filter", Input)
        if self.ckpt is None or self.module_tree.pattern is None or not box.value.strip():
            return Text()
        n = len(self.module_tree.shown_tensors())
        how = filter_kind(box.value)
        if n == 0:
            return Text(f"no tensor matches this {how} (escape clears it)\n", style="bold yellow")
        return Text(f"{how}: {n} of {len(self.ckpt.tensors)} tensors match\n", style="cyan")

    # --- focus and detail ---------------------------------------------------------------------------------

    def _follow_cursor(self) -> None:
        """The detail shows the row under the cursor, and there is always one (the first row after a load or a
        filter), so the highlighted row and the detail never disagree."""
        tree = self.module_tree
        tree.cursor_line = (
            -1
        )  # the tree was rebuilt: its remembered cursor node is gone even if the line is not
        tree.cursor_line = 0 if tree.last_line >= 0 else -1
        node = tree.get_node_at_line(0)
        if node is None:
            self.detail.show_module("Nothing to show", ["No tensor matches the filter: escape clears it."])
        else:
            self._show_data(node.data)

    @on(Tree.NodeHighlighted)
    def _highlighted(self, event: Tree.NodeHighlighted[Any]) -> None:
        self._show_data(event.node.data)

    def _show_data(self, data: object) -> None:
        if self.ckpt is None:
            return
        if isinstance(data, TensorInfo):
            if data.name != self._stats_for:
                self.cancel_stats()
            self.detail.show(self.ckpt, data, zi(self).out_dtype())
            if data.name == self._stats_for and self._results:
                self.detail.set_extra(self._results)
        elif isinstance(data, ModuleNode):
            self._show_module(data)

    def _show_module(self, data: ModuleNode) -> None:
        ts = list(data.walk_tensors())
        selected: set[str] = zi(self).selected
        chosen = sum(1 for t in ts if t.name in selected)
        kinds: dict[str, int] = {}
        for t in ts:
            kinds[str(t.kind)] = kinds.get(str(t.kind), 0) + 1
        tree = self.module_tree
        held = tree.holders_of(data.path)  # an expert's or a pipeline layer's ranks
        at = tree.bytes_words(ts) if held else ""  # `r0` beside `ranks 0, 2`: said, not left to puzzle
        self.detail.show_module(
            data.path or "(root)",
            [
                f"{plural(len(ts), 'tensor')} · {count(data.numel)} parameters · "
                f"{size(sum(self.module_tree.out_bytes(t) for t in ts))} out",
                *([f"held by: {held}"] if held else []),
                *([f"its tensors' bytes: {at} (ZeRO partitions what the ranks hold)"] if at else []),
                "kinds: " + ", ".join(f"{k} {n}" for k, n in kinds.items()),
                f"selected: {chosen} of {len(ts)}",
                "space selects the whole submodule; enter folds it.",
            ],
        )

    # --- filter -------------------------------------------------------------------------------------------

    def action_filter(self) -> None:
        box = self.query_one("#filter", Input)
        box.remove_class("-hidden")
        box.focus()

    @on(ModuleTree.FilterKeys)
    async def _filter_keys(self, event: ModuleTree.FilterKeys) -> None:
        """`/` on the tree, then the keys typed right after it: into the filter box, in order."""
        box = self.query_one("#filter", Input)
        if event.key == "escape":
            self.action_escape()
        elif event.key == "enter":
            await box.action_submit()
        elif event.key == "backspace":
            box.action_delete_left()
        elif event.text:
            box.insert_text_at_cursor(event.text)
        else:
            self.action_filter()

    @on(Input.Changed, "#filter")
    def _filter_changed(self, event: Input.Changed) -> None:
        try:
            pattern = name_filter(event.value)
        except re.error as exc:
            event.input.set_class(True, "-bad-pattern")
            self.query_one("#selection-line", Static).update(Text(f"bad regex: {exc}", style="red"))
            return
        event.input.set_class(False, "-bad-pattern")
        self._set_filter(pattern)
        self._update_selection_line()
        self._follow_cursor()
        self._fill_flat()

    def _set_filter(self, pattern: re.Pattern[str] | None) -> None:
        """The tree shows what `pattern` matches, and the export takes what it shows (`session.exported`)."""
        self.module_tree.set_filter(pattern)
        shown = frozenset(t.name for t in self.module_tree.shown_tensors()) if pattern else None
        zi(self).shown_only = shown

    @on(Input.Submitted, "#filter")
    def _filter_done(self, event: Input.Submitted) -> None:
        if not event.value:
            event.input.add_class("-hidden")
        elif not self._history or self._history[-1] != event.value:
            self._history.append(event.value)
        self._back = 0
        self.focus_tree()

    def action_leave_filter(self) -> None:
        """`↓` in the filter box: to the list it filters, the filter kept."""
        if self.query_one("#filter", Input).has_focus:
            self.focus_tree()

    def action_filter_history(self) -> None:
        """`↑` in the filter box: the filters entered before, newest first."""
        box = self.query_one("#filter", Input)
        if box.has_focus and self._history:
            self._back = min(self._back + 1, len(self._history))
            box.value = self._history[-self._back]
            box.cursor_position = len(box.value)

    def action_escape(self) -> None:
        if self._stats_for is not None and not self._cancel.is_set():
            self.cancel_stats()
            self.detail.set_extra([Text("statistics cancelled", style="yellow")])
            return
        self._clear_filter()

    def _clear_filter(self) -> bool:
        box = self.query_one("#filter", Input)
        if not (box.value or not box.has_class("-hidden")):
            return False
        with self.prevent(Input.Changed):  # cleared here, now: a late Changed would rebuild the tree again
            box.value = ""
        box.add_class("-hidden")
        self._set_filter(None)
        self._update_selection_line()
        self._follow_cursor()
        self._fill_flat()
        self.focus_tree()
        return True

    def reveal(self, name: str) -> None:
        """The cursor (and so the detail) on tensor `name`; a filter that hides it is cleared, and said so."""
        if not self.flat.has_class("-hidden"):  # the tree shows where it lives: back to it
            self.action_flat()
        tree = self.module_tree
        if not tree.reveal(name) and self._clear_filter():
            self.notify("The filter hid that tensor: it is cleared.", timeout=3, markup=False)
            tree.reveal(name)
        tree.focus()

    # --- statistics ---------------------------------------------------------------------------------------

    def cancel_stats(self) -> None:
        self._cancel.set()
        self._stats_for = None
        self._results = []

    def action_stats(self) -> None:
        t = self.detail.tensor
        if self.ckpt is None or t is None:
            self.notify("Move to a tensor first.", severity="warning")
            return
        if not t.segments:
            self.notify(
                f"{shown(t.name)} has no data of its own (tied or empty).", severity="warning", markup=False
            )
            return
        self.cancel_stats()
        self._cancel = threading.Event()
        self._stats_for = t.name
        self._results = []
        self._stats_worker(self.ckpt, t, self._cancel)

    @work(thread=True, exclusive=True, group="stats", exit_on_error=False, description="statistics")
    def _stats_worker(self, ckpt: Checkpoint, t: TensorInfo, cancel: threading.Event) -> None:
        shell = zi(self)
        stream_stats(
            ckpt, t, cancel, self.post_message, timed=shell.live_meters, tp_split=tuple(shell.tp_split)
        )

    @on(StatsUpdate)
    def _stats_update(self, msg: StatsUpdate) -> None:
        if msg.name != self._stats_for or self.detail.tensor is None or self.detail.tensor.name != msg.name:
            return
        if msg.result is not None:
            self._results.append(msg.result)
            self.detail.set_extra(list(self._results))
        elif msg.progress is not None:
            self.detail.set_extra(
                [
                    *self._results,
                    Text(f"{msg.what}… {msg.progress.fraction:.0%} (escape cancels)", style="italic"),
                ]
            )
        elif msg.done:
            self.detail.set_extra(list(self._results))
            self._cancel.set()  # finished: escape goes back to clearing the filter
        # the statistics go below where the bytes live: on a short terminal (80x24, stacked) that is under the
        # fold, and `s` looked like it did nothing; keep what is being read in view
        column = self.query_one("#detail-column", VerticalScroll)
        self.call_after_refresh(column.scroll_end, animate=False)
