"""The raw items of the keys a scan reads, visited file by file in offset order, each file through one
descriptor (one file open at a time) with each item's small parts read ahead (`format/readahead.py`); what
each item proved is kept by chunk row for `Store.segments`, which still walks the keys in order.

Walking key by key instead opened an item's file once per item (24,576 opens for 1,024 ranks of 24 items) and
jumped between files. A row not visited here (its file cannot be opened, a compressed item) is placed when
its key is read, as before, so each finding is still the one its item earns on its own.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from inspector.errors import InspectorError
from inspector.format.itemrepeat import Repeats
from inspector.format.readahead import ReadAhead
from inspector.parse.dcp import DcpMetadata, Item
from inspector.scan.layouts.dcp.items import Proven, Via, place_in
from inspector.scan.layouts.dcp.placement import Chunk, runs, slabs
from inspector.scan.model import Segment
from inspector.system.bytesource import ByteSource

if TYPE_CHECKING:
    import numpy as np


class Placements:
    """Per chunk row: where the visit found its chunk's bytes in its file, or the refusal its item earned;
    a row not visited has neither. Compact: one int64 a row, refusals only for damaged items."""

    def __init__(self, rows: int) -> None:
        import numpy as np

        self.offsets = np.full(rows, -1, np.int64)
        self.refused: dict[int, InspectorError] = {}

    def get(self, row: int) -> int | InspectorError | None:
        offset = int(self.offsets[row])
        return offset if offset >= 0 else self.refused.get(row)

    def rows(self, meta: DcpMetadata, key: str) -> Rows | None:
        """The key's chunks at once when the visit placed every one and each has the key's rank (else None:
        the key walk looks at its rows one by one)."""
        import numpy as np

        t = meta.tensors[key]
        lo, hi, nd = t.first, t.first + t.count, len(t.shape)
        offsets = self.offsets[lo:hi]
        if not t.count or bool((offsets < 0).any()):
            return None
        start = int(meta.starts[lo])
        end = int(meta.starts[hi]) if hi < len(meta.starts) else len(meta.dims)
        if end != start + 2 * nd * t.count or bool(
            (meta.starts[lo:hi] != start + 2 * nd * np.arange(t.count)).any()
        ):
            return None
        names = [meta.file_names[f] for f in meta.item_file[lo:hi].tolist()]
        return Rows(meta.dims[start:end].reshape(t.count, 2 * nd), names, offsets.tolist())


@dataclass(frozen=True, slots=True)
class Rows:
    """A key's placed chunks, in row order: their dims (offsets then sizes, one row each), the names of the
    files they are in and where their bytes start there."""

    dims: np.ndarray
    names: list[str]
    offsets: list[int]

    def segments(
        self, shape: tuple[int, ...], dtype: str, path_of: Callable[[str], str]
    ) -> Sequence[Segment]:
        """The chunks laid as `runs` lays them: at once when they are row slabs that tile (`slabs`), else
        by `runs` itself (`TilingError` when they do not tile)."""
        paths = [path_of(n) for n in self.names]
        laid = slabs(shape, dtype, self.dims, paths, self.offsets)
        if laid is not None:
            return laid
        nd = self.dims.shape[1] // 2
        chunks = [
            Chunk(tuple(d[:nd]), tuple(d[nd:]), p, o)
            for d, p, o in zip(self.dims.tolist(), paths, self.offsets, strict=True)
        ]
        return runs(shape, dtype, chunks)


def visit(folder: str, source: ByteSource, meta: DcpMetadata, keys: Iterable[str]) -> Placements:
    """Check the raw items of `keys` (tensor keys of `meta`) file by file, in offset order in each file."""
    import numpy as np

    out = Placements(len(meta.starts))
    keys = [k for k in dict.fromkeys(keys) if k in meta.tensors]
    if not keys or not len(meta.starts):
        return out
    tensors = [meta.tensors[k] for k in keys]
    rows = np.concatenate([np.arange(t.first, t.first + t.count, dtype=np.int64) for t in tensors])
    which = np.repeat(np.arange(len(tensors)), [t.count for t in tensors])
    raw = [i for i, ts in enumerate(meta.transforms) if not ts]
    keep = (meta.item_file[rows] >= 0) & np.isin(meta.item_transform[rows], raw)
    rows, which = rows[keep], which[keep]
    if not len(rows):
        return out
    repeats = Repeats()  # a save's items repeat one another across its files
    proven: Proven = {}
    order = np.lexsort((meta.item_offset[rows], meta.item_file[rows]))
    rows, which = rows[order], which[order]
    files = meta.item_file[rows]
    cuts = np.flatnonzero(np.diff(files)) + 1
    for group, kinds in zip(np.split(rows, cuts), np.split(which, cuts), strict=True):
        items = [
            Item(meta.file_names[int(meta.item_file[group[0]])], offset, length, ())
            for offset, length in zip(
                meta.item_offset[group].tolist(), meta.item_length[group].tolist(), strict=True
            )
        ]
        dtypes = [tensors[i].dtype for i in kinds.tolist()]
        _visit_file(folder, source, meta, group.tolist(), items, dtypes, out, (repeats, proven))
    return out


def _visit_file(
    folder: str,
    source: ByteSource,
    meta: DcpMetadata,
    rows: list[int],
    items: list[Item],
    dtypes: list[str],
    out: Placements,
    shared: tuple[Repeats, Proven],
) -> None:
    """One file's rows and their items (in offset order) through one descriptor, with what the scan's items
    so far proved (`shared`); a file that cannot be opened is left to the key walk, which reports it as it
    always did."""
    path = os.path.join(folder, items[0].file)
    try:
        handle = source.open_handle(path)
    except InspectorError:
        return
    via = Via(ReadAhead(handle, path), *shared)
    try:
        for row, item, dtype in zip(rows, items, dtypes, strict=True):
            placed = place_in(folder, item, dtype, meta.chunk(row)[1], via)
            if isinstance(placed, int):
                out.offsets[row] = placed
            else:
                out.refused[row] = placed
    finally:
        handle.close()
