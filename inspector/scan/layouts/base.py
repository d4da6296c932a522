"""The layout protocol: what a checkpoint layout (data-parallel ZeRO, pipeline, MoE, AutoEP, tensor parallel,
universal, PyTorch DCP) offers the scanner. One package per layout under `scan/layouts/`, one line in `LAYOUTS`.

The scanner asks each layout in `LAYOUTS`' order, twice:

1. `locate(path, tag, source)`: a layout whose folders the DeepSpeed `latest`/tag walk does not understand (a
   universal checkpoint, a DCP folder with its `.metadata`) finds its folder here and answers a `Found`; the
   others answer None. The first `Found` wins.
2. Otherwise the ordinary walk (`scan/locate.py`) picks the tag folder, and `claims(found)` is asked with its
   file names (and records a claim parsed, kept in `found.memo` for the next layout and the scan).

The winner's `scan(found, options)` builds the `Checkpoint`, filling the records later stages read
(`Parallel.words`, `Parallel.placement`, each tensor's segments and `stage`), so no kind, face or health check
branches on a layout's name. Nothing outside `scan/layouts/` imports one layout's module: they go through the
registry (`inspector.scan.layouts`) and the records.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    from inspector.scan.locate import Location
    from inspector.scan.model import Checkpoint, Finding
    from inspector.system.bytesource import ByteSource


@dataclass(frozen=True)
class ScanOptions:
    """What the user said about how to read the checkpoint. `tp_split`: (glob, rule) pairs saying how a
    tensor-parallel checkpoint that records no split joins its shards (rule `0`, `1` or `replicated`)."""

    tp_split: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class Found:
    """What locating saw, before any layout read a rank file: the confined source, the root the user's path
    resolved to, the chosen tag (`""` for a tagless layout such as a DCP or universal folder, whose `tag_dir`
    is the folder itself) and the names in `tag_dir`. `how`, `tags`, `findings`, `other_runs`: locate's
    answer for the `Checkpoint` (how the folder was reached: `deepspeed`, `hf-trainer`, `lightning`,
    `tag-dir`). `memo`: records a claim already parsed (say the rank files' classification), keyed by the
    claiming layout, so the scan does not read them again."""

    source: ByteSource
    root: str
    tag: str
    tag_dir: str
    names: tuple[str, ...]
    how: str = "deepspeed"
    tags: tuple[str, ...] = ()
    findings: tuple[Finding, ...] = ()
    other_runs: tuple[str, ...] = ()
    memo: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def of(cls, loc: Location) -> Found:
        """The `Found` for a tag folder the DeepSpeed walk chose (its names listed once, here)."""
        names = tuple(loc.source.listdir(loc.tag_dir))
        return cls(
            loc.source, loc.root, loc.tag, loc.tag_dir, names, loc.layout, loc.tags, loc.findings, loc.other_runs
        )

    @property
    def trees(self) -> dict[str, Any]:
        """Object trees a claim loaded, by path (say the rank-0 model states, to look for a layout's
        records): the scan that follows takes a file's tree from here instead of loading it again."""
        trees: dict[str, Any] = self.memo.setdefault("trees", {})
        return trees

    @property
    def location(self) -> Location:
        """The same answer as the DeepSpeed walk's `Location` (what the tag-folder scanners take)."""
        from inspector.scan.locate import Location

        root, tag = (self.root, self.tag) if self.tag else os.path.split(self.tag_dir.rstrip(os.sep))
        return Location(root, tag, self.tags, self.how, self.findings, self.other_runs, source=self.source)


def tree_at(trees: dict[str, Any], path: str, source: ByteSource) -> Any:
    """`path`'s object tree: the one a claim or an earlier step of this scan loaded (`Found.trees`), else
    loaded now and kept there, so no step of one scan loads a file twice."""
    if path not in trees:
        from inspector.format.torchzip import load_tree

        trees[path] = load_tree(path, source)
    return trees[path]


@runtime_checkable
class Layout(Protocol):
    """One checkpoint layout. `name`: a short word for messages (`pipeline`, `native MoE`);
    `recognises`: what it looks for, in a few words, for the refusal that names what nothing claimed."""

    name: str
    recognises: str

    def locate(self, path: str, tag: str | None, source: ByteSource) -> Found | None:
        """This layout's own folder at `path` (one the tag walk cannot find), else None. Cheap: names and
        small files only."""
        ...

    def claims(self, found: Found) -> bool:
        """Whether the tag folder the walk chose is this layout's, from its file names (and records parsed
        once, kept in `found.memo`)."""
        ...

    def scan(self, found: Found, options: ScanOptions) -> Checkpoint:
        """The folder as a `Checkpoint`, metadata only."""
        ...


class TagLayout:
    """A layout found by the DeepSpeed tag walk: no folder of its own to locate."""

    name = ""
    recognises = ""

    def locate(self, path: str, tag: str | None, source: ByteSource) -> Found | None:
        return None


__all__ = ["Found", "Layout", "ScanOptions", "TagLayout", "tree_at"]
