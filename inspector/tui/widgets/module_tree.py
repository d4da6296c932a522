"""The module hierarchy as a tree with subtotals, selection marks and a filter.

`space` (or a click on a row's mark) toggles a tensor or a whole submodule, `a`/`n`/`i` select all/none/invert (of what the filter
shows); the selection is posted as `SelectionChanged` and becomes convert's include/exclude.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass

from rich.style import Style
from rich.text import Text
from textual import events
from textual.binding import Binding
from textual.message import Message
from textual.widgets import Tree
from textual.widgets.tree import TreeNode

from inspector.format.dtypes import itemsize
from inspector.scan.model import Checkpoint, Kind, TensorInfo
from inspector.tui.fmt import KIND_STYLE, count, dtype, plural, shape, shown, size
from inspector.tui.holders import module_holders, span
from inspector.tui.session import ModuleNode, build_tree, rank_of_file

Data = ModuleNode | TensorInfo
ON, OFF, SOME = "■", "□", "◪"
MARK_META = Style.from_meta({"select_mark": True})  # a click on a row's mark toggles its selection


def ranks_label(ranks: list[int]) -> str:
    """[0, 1, 2, 5] -> "r0-2,5"."""
    if not ranks:
        return ""
    out, start, prev = [], ranks[0], ranks[0]
    for r in [*ranks[1:], None]:
        if r is not None and r == prev + 1:
            prev = r
            continue
        out.append(f"{start}" if start == prev else f"{start}-{prev}")
        if r is not None:
            start = prev = r
    return "r" + ",".join(out)


class ModuleTree(Tree[Data]):
    """Natural-order module tree; each row shows its selection mark and subtotals."""

    BINDINGS = [
        Binding("space", "toggle_select", "Select", tooltip="toggle the tensor or submodule"),
        Binding("a", "select_all", "All"),
        Binding("n", "select_none", "None", show=False),  # `?` lists them; the footer stays light
        Binding("i", "invert", "Invert", show=False),
        Binding("right", "unfold", "Unfold", show=False),
        Binding("left", "fold", "Fold", show=False),
        # the keys of less, vim, htop and k9s: down, up, first, last
        Binding("j", "cursor_down", "Down", show=False),
        Binding("k", "cursor_up", "Up", show=False),
        Binding("g", "first", "First", show=False),
        Binding("G", "last", "Last", show=False),
    ]

    @dataclass
    class SelectionChanged(Message):
        selected: frozenset[str]

    @dataclass
    class FilterKeys(Message):
        """`/` on the tree opens the filter (`text` and `key` empty); keys typed right after it that reached the
        tree before the filter box took the focus follow as `text` (printable) or `key` (backspace, enter,
        escape), so they are typed into the filter instead of selecting, unfolding or leaving the tab."""

        text: str = ""
        key: str = ""

    FILTER_KEYS = ("backspace", "enter", "escape")

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__("model", id=id)
        self.ckpt: Checkpoint | None = None
        self.selected: set[str] = set()
        self.pattern: re.Pattern[str] | None = None
        self.out_dtype = "float32"
        self.dedupe_tied = False  # convert writes a tied alias under its own name too unless --dedupe-tied
        self._ranks: dict[str, list[int]] = {}
        self._holders: dict[str, str] = {}  # module path -> who holds it (experts, pipeline layers)
        self._typing_filter = (
            False  # `/` was pressed here: keys still queued for the tree belong to the filter
        )
        self.show_root = False
        self.guide_depth = 2

    # --- building -------------------------------------------------------------------------------------------

    def load(self, ckpt: Checkpoint, selected: set[str], out_dtype: str) -> None:
        self.ckpt, self.selected, self.out_dtype = ckpt, set(selected), out_dtype
        owner = rank_of_file(ckpt)
        self._holders = module_holders(ckpt.parallel)
        self._ranks = {}
        for t in ckpt.tensors:
            rs = {owner.get(s.file, "") for s in t.segments}
            self._ranks[t.name] = sorted(int(r[5:]) for r in rs if r.startswith("rank "))
        self.rebuild()

    def ranks_of(self, name: str) -> list[int]:
        """The data-parallel ranks whose files hold part of tensor `name`."""
        return self._ranks.get(name, [])

    def holders_of(self, path: str) -> str:
        """Who holds module `path` of a model-parallel checkpoint (`expert 3 · ranks 1, 3`), or ""."""
        return self._holders.get(path, "")

    def bytes_words(self, tensors: list[TensorInfo]) -> str:
        """Which ranks' files hold these tensors' bytes (`rank 0`): under ZeRO a group held by ranks 0 and 2
        is partitioned, so one expert's tensors can all lie in rank 0's part, as their `r0` marks say."""
        ranks = sorted({r for t in tensors for r in self._ranks.get(t.name, [])})
        return f"rank{'s' if len(ranks) > 1 else ''} {span(ranks)}" if ranks else ""

    def unload(self) -> None:
        """No checkpoint: an empty tree (the next `load` fills it)."""
        self.ckpt, self.selected, self.pattern, self._ranks, self._holders = None, set(), None, {}, {}
        self.clear()

    def shown_tensors(self) -> list[TensorInfo]:
        if self.ckpt is None:
            return []
        p = self.pattern
        return [t for t in self.ckpt.tensors if p is None or p.search(t.name)]

    def rebuild(self) -> None:
        self.clear()
        tree = build_tree(self.shown_tensors())
        self.root.data = tree
        expand_all = self.pattern is not None
        self._add(self.root, tree, expand_all, depth=0)
        self.root.expand()
        self.refresh_labels()

    def _add(self, parent: TreeNode[Data], node: ModuleNode, expand_all: bool, depth: int) -> None:
        for child in node.children.values():
            # a chain of single children (model → layers) opens by itself: nobody wants to click twice
            auto = expand_all or len(node.children) == 1 or depth == 0
            sub = parent.add("", data=child, expand=auto)
            self._add(sub, child, expand_all, depth + 1)
        for t in node.tensors:
            parent.add_leaf("", data=t)

    # --- labels ---------------------------------------------------------------------------------------------

    def out_bytes(self, t: TensorInfo) -> int:
        if t.kind is Kind.TIED and self.dedupe_tied:
            return 0
        return t.numel * itemsize(self.out_dtype) if t.is_floating else t.nbytes

    def _walk_nodes(self, node: TreeNode[Data] | None = None) -> Iterator[TreeNode[Data]]:
        """Every node below the root, depth first, folded ones included."""
        for child in (node or self.root).children:
            yield child
            yield from self._walk_nodes(child)

    def refresh_labels(self) -> None:
        for node in self._walk_nodes():
            node.set_label(self._label(node.data))

    def _mark(self, names: list[str]) -> tuple[str, str]:
        chosen = sum(1 for n in names if n in self.selected)
        if chosen == len(names) and names:
            return ON, "bold green"
        return (SOME, "yellow") if chosen else (OFF, "dim")

    @staticmethod
    def _append_mark(text: Text, mark: str, style: str) -> None:
        text.append(mark, style=Style.parse(style) + MARK_META)
        text.append(" ")

    def _label(self, data: Data | None) -> Text:
        text = Text(no_wrap=True, overflow="ellipsis")
        if isinstance(data, ModuleNode):
            ts = list(data.walk_tensors())
            mark, style = self._mark([t.name for t in ts])
            self._append_mark(text, mark, style)
            text.append(shown(data.name), style="bold")
            # parameters are counted once: a submodule holding only tied aliases (lm_head) says so, not "0"
            only_tied = ts and not data.numel and all(t.kind is Kind.TIED for t in ts)
            params = "tied" if only_tied else count(data.numel)
            text.append(
                f"  {plural(len(ts), 'tensor')} · {params} · {size(sum(self.out_bytes(t) for t in ts))}",
                style="dim",
            )
            if data.path in self._holders:
                text.append(f"  {self._holders[data.path]}", style="cyan")
        elif isinstance(data, TensorInfo):
            mark, style = self._mark([data.name])
            self._append_mark(text, mark, style)
            text.append(shown(data.name.rpartition(".")[2]))
            text.append(f"  {shape(data.shape)} {dtype(data.dtype)} ", style="dim")
            text.append(str(data.kind), style=KIND_STYLE[data.kind])
            if data.alias_of:
                text.append(f" → {shown(data.alias_of)}", style="dim")
            text.append(f" {ranks_label(self._ranks.get(data.name, []))}", style="dim")
        return text

    # --- selection ------------------------------------------------------------------------------------------

    def _names_under(self, node: TreeNode[Data] | None) -> list[str]:
        data = node.data if node else None
        if isinstance(data, ModuleNode):
            return data.names
        if isinstance(data, TensorInfo):
            return [data.name]
        return []

    def _changed(self) -> None:
        self.refresh_labels()
        self.post_message(self.SelectionChanged(frozenset(self.selected)))

    def set_selection(self, names: set[str]) -> None:
        self.selected = set(names)
        self._changed()

    async def on_key(self, event: events.Key) -> None:
        """`/` opens the filter from here, in key order: Textual forwards a burst of keys (a fast typist, a
        paste, tmux) to the tree before the filter box can take the focus, so what follows `/` is passed on."""
        if event.key == "slash" and not self._typing_filter:
            self._typing_filter = True
            self.post_message(self.FilterKeys())
        elif self._typing_filter and event.is_printable and event.character:
            self.post_message(self.FilterKeys(text=event.character))
        elif self._typing_filter and event.key in self.FILTER_KEYS:
            self.post_message(self.FilterKeys(key=event.key))
        else:
            return
        event.prevent_default()  # not the Tree's own handling
        event.stop()  # nor the bindings of the tree, the pane or the app (a, n, e, c, q ...)

    def on_focus(self) -> None:
        self._typing_filter = False  # back from the filter box: keys are the tree's again

    async def _on_click(self, event: events.Click) -> None:
        """A click on the mark (■ □ ◪) toggles that row's selection; elsewhere the Tree's own click."""
        meta = event.style.meta
        if meta.get("select_mark") and "line" in meta:
            event.prevent_default()  # not also the Tree's select/expand of the row
            event.stop()
            self.cursor_line = meta["line"]
            self.action_toggle_select()

    def action_toggle_select(self) -> None:
        names = self._names_under(self.cursor_node)
        if not names:
            return
        if all(n in self.selected for n in names):
            self.selected.difference_update(names)
        else:
            self.selected.update(names)
        self._changed()

    def reveal(self, name: str) -> bool:
        """Put the cursor on the tensor or submodule called `name` (dotted), unfolding what hides it."""

        for node in self._walk_nodes():
            data = node.data
            if (isinstance(data, TensorInfo) and data.name == name) or (
                isinstance(data, ModuleNode) and data.path == name
            ):
                parent = node.parent
                while parent is not None:
                    parent.expand()
                    parent = parent.parent
                self.call_after_refresh(self.move_cursor, node)  # the unfolded lines exist after a refresh
                return True
        return False

    def action_first(self) -> None:
        self.cursor_line = 0

    def action_last(self) -> None:
        self.cursor_line = self.last_line

    def action_unfold(self) -> None:
        """→: open a folded submodule, else step to its first child (as file managers do)."""
        node = self.cursor_node
        if node is None or not node.allow_expand:
            return
        if not node.is_expanded:
            node.expand()
        elif node.children:
            first = node.children[0]
            if first.line < 0:  # unfolded by a → just before (key repeat): its lines exist after a refresh
                self.call_after_refresh(self.move_cursor, first)
            else:
                self.move_cursor(first)

    def action_fold(self) -> None:
        """←: fold an open submodule, else step to the parent."""
        node = self.cursor_node
        if node is None:
            return
        if node.allow_expand and node.is_expanded:
            node.collapse()
        elif node.parent is not None and node.parent is not self.root:
            self.move_cursor(node.parent)

    def action_select_all(self) -> None:
        self.selected.update(t.name for t in self.shown_tensors())
        self._changed()

    def action_select_none(self) -> None:
        self.selected.difference_update(t.name for t in self.shown_tensors())
        self._changed()

    def action_invert(self) -> None:
        for t in self.shown_tensors():
            self.selected.symmetric_difference_update({t.name})
        self._changed()

    def set_filter(self, pattern: re.Pattern[str] | None) -> None:
        self.pattern = pattern
        self.rebuild()
