"""A DCP item is a complete `torch.save` zip at `[offset, offset+length)` of its `.distcp` file: read with the
zip reader and restricted unpickler in that window, it says where the chunk's bytes are (`data/0`, in the
file) and proves they are the chunk: its dtype, its sizes, contiguous, starting at element 0."""

from __future__ import annotations

import os
from dataclasses import dataclass

from inspector.errors import CorruptFileError, InspectorError, UnsupportedCheckpointError
from inspector.format.torchzip import load
from inspector.format.views import TensorRef
from inspector.parse.dcp import ZSTD, Item
from inspector.system.bytesource import ByteSource
from inspector.text import shown


@dataclass(frozen=True, slots=True)
class Placed:
    """A chunk's bytes: `file` (absolute path) from `offset`, contiguous, in the key's dtype."""

    file: str
    offset: int


def refuse_transforms(folder: str, transforms: tuple[tuple[str, ...], ...]) -> None:
    """Items stored through a transform (the zstd extension, or one this tool does not know) cannot be read
    in place by offset: refused, naming it, before anything is planned."""
    used = sorted({t for ts in transforms for t in ts})
    if not used:
        return
    names = ", ".join(shown(t) for t in used)
    if all(t == ZSTD for t in used):
        why = (
            "its items are zstd-compressed (DCP's `stream.zstd/1` extension); this tool reads tensors in "
            "place by offset and does not decompress DCP items"
        )
    else:
        why = f"its items are stored through a transform this tool does not know ({names})"
    raise UnsupportedCheckpointError(
        f"{shown(folder)}: a PyTorch Distributed Checkpoint whose {why}.",
        hint="Load it with torch.distributed.checkpoint and save it again without compression "
        "(the default FileSystemWriter); then scan the new folder.",
        title="Compressed DCP items",
    )


def place(folder: str, source: ByteSource, item: Item, dtype: str, sizes: tuple[int, ...]) -> Placed:
    """Where `item`'s chunk bytes start in its file, after checking the embedded archive describes exactly
    the chunk the metadata says (dtype, sizes, contiguous from element 0)."""
    path = os.path.join(folder, item.file)
    tree, archive = load(path, source, window=(item.offset, item.length))
    archive.close()
    where = f"{shown(path)} (item at byte {item.offset})"
    if not isinstance(tree, TensorRef):
        raise CorruptFileError(
            f"{where}: the item is not a tensor, but the metadata says it holds one.",
            hint="The folder is damaged or its files come from another save; copy it again.",
        )
    if tree.dtype != dtype or tree.shape != sizes or tree.storage_offset != 0 or not tree.is_contiguous():
        raise CorruptFileError(
            f"{where}: the item holds a {tree.dtype} tensor of shape {list(tree.shape)}, but the metadata "
            f"says a contiguous {dtype} chunk of shape {list(sizes)}.",
            hint="The folder is damaged or its files come from another save; copy it again.",
        )
    return Placed(path, tree.offset)


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
    handle = source.open_handle(placed.file)
    try:
        raw = handle.pread(struct.calcsize(fmt), placed.offset)
    finally:
        handle.close()
    return float(struct.unpack(fmt, raw)[0]) if len(raw) == struct.calcsize(fmt) else None
