"""A DCP item is a complete `torch.save` zip at `[offset, offset+length)` of its `.distcp` file: read with the
zip reader and restricted unpickler in that window, it says where the chunk's bytes are (`data/0`, in the
file) and proves they are the chunk: its dtype, its sizes, contiguous, starting at element 0.

An item saved through the zstd extension is read the same way from its decompressed bytes, through a path
of its own (`format/zstditem.py`): its chunk's bytes are at an offset of that path, which every reader
opens (`convert.reader.FilePool`) as it opens a file."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Any

from inspector.errors import CorruptFileError, InspectorError, UnsupportedCheckpointError
from inspector.format.dtypes import itemsize
from inspector.format.itemrepeat import Repeats
from inspector.format.readahead import ReadAhead
from inspector.format.torchzip import load
from inspector.format.views import TensorRef
from inspector.format.zstditem import (
    OVERHEAD,
    item_path,
    measure_item,
    open_item,
    parse_item_path,
    require_zstandard,
)
from inspector.parse.dcp import ZSTD, Item
from inspector.system.bytesource import ByteSource
from inspector.text import shown

Proven = dict[int, tuple[Any, dict[tuple[str, tuple[int, ...]], int]]]  # by id: a tree, its verdicts
_PROVEN_MAX = 4096  # trees whose verdicts are kept (a save's items come in a few shapes)


@dataclass(frozen=True, slots=True)
class Via:
    """A file open for its raw items (`ahead`), the scan's items read so far (`repeats`), and what the
    repeats' trees were proven to be: by tree, the chunk (dtype, sizes) each is and where its bytes start
    (the tree is kept with its verdicts, so its id names it for as long as they are kept)."""

    ahead: ReadAhead
    repeats: Repeats
    proven: Proven


@dataclass(frozen=True, slots=True)
class Placed:
    """A chunk's bytes: `file` (absolute path, or a compressed item's path) from `offset`, contiguous, in the
    key's dtype."""

    file: str
    offset: int


def refuse_transforms(folder: str, transforms: tuple[tuple[str, ...], ...]) -> None:
    """Items stored through a transform other than the zstd extension alone (one this tool does not know,
    or zstd chained with another) cannot be read: refused, naming it, before anything is planned; zstd
    items without the `zstandard` package likewise, saying how to get it."""
    unknown = sorted({t for ts in transforms if ts not in ((), (ZSTD,)) for t in ts})
    if not unknown:
        if (ZSTD,) in transforms:
            require_zstandard()
        return
    names = ", ".join(shown(t) for t in unknown)
    raise UnsupportedCheckpointError(
        f"{shown(folder)}: a PyTorch Distributed Checkpoint whose items are stored through a transform this "
        f"tool does not know ({names}); it reads raw items and DCP's zstd extension (`{ZSTD}`) only.",
        hint="Load it with torch.distributed.checkpoint and save it again without that extension "
        "(the default FileSystemWriter); then scan the new folder.",
        title="Unknown DCP transform",
    )


def place(folder: str, source: ByteSource, item: Item, dtype: str, sizes: tuple[int, ...]) -> Placed:
    """Where `item`'s chunk bytes start in its file, after checking the embedded archive describes exactly
    the chunk the metadata says (dtype, sizes, contiguous from element 0). The file is opened for this item
    alone (the scan's visit reads a file's raw items through one descriptor: `place_in`)."""
    path = os.path.join(folder, item.file)
    if item.transforms:  # (ZSTD,): the others are refused with the folder
        bound = math.prod(sizes) * itemsize(dtype) + OVERHEAD  # more is a zip bomb, not this chunk
        handle = measure_item(path, source, item.offset, item.length, bound)
        path = item_path(path, item.offset, item.length, handle.size)
        tree, archive = load(path, handle=handle)
    else:
        tree, archive = load(path, source, window=(item.offset, item.length))
    archive.close()
    return Placed(path, _start(folder, item, tree, dtype, sizes))


def place_in(folder: str, item: Item, dtype: str, sizes: tuple[int, ...], via: Via) -> int | InspectorError:
    """`try_place` of a raw item of the file `via` has open, with the items read from it so far: where its
    chunk's bytes start in that file, or the refusal it earned (the same checks, the same words)."""
    try:
        tree, shift = via.repeats.read(via.ahead, via.ahead.path, item.offset, item.length)
        if not shift:  # read in full: its own tree
            return _start(folder, item, tree, dtype, sizes)
        if len(via.proven) >= _PROVEN_MAX and id(tree) not in via.proven:
            via.proven.clear()
        _, verdicts = via.proven.setdefault(id(tree), (tree, {}))  # a repeat: a tree met before
        start = verdicts.get((dtype, sizes))
        if start is None:
            start = verdicts[(dtype, sizes)] = _start(folder, item, tree, dtype, sizes)
        return start + shift
    except InspectorError as exc:
        return exc


def _start(folder: str, item: Item, tree: Any, dtype: str, sizes: tuple[int, ...]) -> int:
    """Where the tree's tensor starts, once it is proven to be the chunk the metadata says."""
    if not isinstance(tree, TensorRef):
        raise CorruptFileError(
            f"{_where(folder, item)}: the item is not a tensor, but the metadata says it holds one.",
            hint="The folder is damaged or its files come from another save; copy it again.",
        )
    if tree.dtype != dtype or tree.shape != sizes or tree.storage_offset != 0 or not tree.is_contiguous():
        raise CorruptFileError(
            f"{_where(folder, item)}: the item holds a {tree.dtype} tensor of shape {list(tree.shape)}, but "
            f"the metadata says a contiguous {dtype} chunk of shape {list(sizes)}.",
            hint="The folder is damaged or its files come from another save; copy it again.",
        )
    return tree.offset


def _where(folder: str, item: Item) -> str:
    """The item in a message (made only when there is one to say: names pass `shown`)."""
    return f"{shown(os.path.join(folder, item.file))} (item at byte {item.offset})"


def try_place(
    folder: str, source: ByteSource, item: Item, dtype: str, sizes: tuple[int, ...]
) -> Placed | InspectorError:
    """`place`, with its refusal returned (the scan makes a finding of it) instead of raised."""
    try:
        return place(folder, source, item, dtype, sizes)
    except InspectorError as exc:
        return exc


def read_scalar(source: ByteSource, placed: Placed, dtype: str) -> float | None:
    """A 0-d tensor's value (the optimizer's `step`), read from its bytes; None when it cannot be read."""
    import struct

    from inspector.format.dtypes import DTYPES

    fmt = DTYPES[dtype].struct
    if fmt is None:
        return None
    handle: Any = (
        open_item(placed.file, (source,)) if parse_item_path(placed.file) else source.open_handle(placed.file)
    )
    try:
        raw = handle.pread(struct.calcsize(fmt), placed.offset)
    finally:
        handle.close()
    return float(struct.unpack(fmt, raw)[0]) if len(raw) == struct.calcsize(fmt) else None
