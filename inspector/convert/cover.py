"""The module tree of a checkpoint's tensors, and the shortest include/exclude that select exactly a set of
them: the app turns its selection into convert's options with it, and `convert --selection NAME` does too, so
both faces plan the same options and write the same bytes (the job's fingerprint in the header included)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field, replace

from inspector.convert.options import ConvertOptions, select
from inspector.scan.model import Checkpoint, Kind, TensorInfo


@dataclass
class ModuleNode:
    """A submodule (or the root) with subtotals over every tensor below it, in natural order."""

    name: str  # the last path component ("layers", "0", "q_proj")
    path: str  # the full dotted prefix ("model.layers.0"); "" for the root
    children: dict[str, ModuleNode] = field(default_factory=dict)
    tensors: list[TensorInfo] = field(default_factory=list)

    def walk_tensors(self) -> Iterator[TensorInfo]:
        yield from self.tensors
        for child in self.children.values():
            yield from child.walk_tensors()

    @property
    def names(self) -> list[str]:
        return [t.name for t in self.walk_tensors()]

    @property
    def numel(self) -> int:
        return sum(t.numel for t in self.walk_tensors() if t.kind is not Kind.TIED)

    def count(self) -> int:
        return sum(1 for _ in self.walk_tensors())


def _order(key: str, first_seen: int) -> tuple[int, int, str]:
    """Natural order: numbered siblings (`layers.2` before `layers.10`) numerically, others as in the model."""
    return (0, int(key), "") if key.isdigit() else (1, first_seen, key)


def build_tree(tensors: Iterable[TensorInfo]) -> ModuleNode:
    """The module hierarchy of `tensors`: `a.b.c.weight` lives in node a → b → c."""
    root = ModuleNode("", "")
    seen: dict[int, dict[str, int]] = {}
    for t in tensors:
        node = root
        parts = t.name.split(".")
        for part in parts[:-1]:
            order = seen.setdefault(id(node), {})
            order.setdefault(part, len(order))
            child = node.children.get(part)
            if child is None:
                child = node.children[part] = ModuleNode(part, f"{node.path}.{part}" if node.path else part)
            node = child
        node.tensors.append(t)

    def sort(node: ModuleNode) -> None:
        order = seen.get(id(node), {})
        node.children = dict(sorted(node.children.items(), key=lambda kv: _order(kv[0], order.get(kv[0], 0))))
        for child in node.children.values():
            sort(child)

    sort(root)
    return root


def selection_options(ckpt: Checkpoint, selected: set[str], base: ConvertOptions) -> ConvertOptions:
    """`base` with include/exclude that select exactly `selected` (convert's own rules), as short as possible.

    Whole submodules become module prefixes; the include or the exclude form is used, whichever is shorter.
    """
    every = [t.name for t in ckpt.tensors]
    plain = replace(base, include=(), exclude=(), exclude_frozen=False, exclude_buffers=False)
    if set(every) <= selected:
        return replace(base, include=(), exclude=())
    tree = build_tree(ckpt.tensors)
    include = _cover(tree, selected)
    exclude = _cover(tree, set(every) - selected)
    opts = (
        replace(plain, include=tuple(include))
        if len(include) <= len(exclude)
        else replace(plain, exclude=tuple(exclude))
    )
    if {t.name for t in select(ckpt, opts)} != selected:  # a prefix that also matches a sibling: be exact
        opts = replace(plain, include=tuple(sorted(selected, key=every.index)))
    return replace(opts, exclude_frozen=base.exclude_frozen, exclude_buffers=base.exclude_buffers)


def _cover(node: ModuleNode, chosen: set[str]) -> list[str]:
    """The fewest module prefixes and names that cover exactly `chosen` below `node`."""
    names = node.names
    if not names or not chosen.intersection(names):
        return []
    if node.path and set(names) <= chosen:
        return [node.path]
    out = [t.name for t in node.tensors if t.name in chosen]
    for child in node.children.values():
        out += _cover(child, chosen)
    return out
