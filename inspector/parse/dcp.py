"""A DCP folder's `.metadata` as typed records: keys, their chunks (global offsets and sizes, as numpy rows)
and the item each chunk is stored in (file, offset, length, transforms).

The pickle is read by `format/dcpmeta.py` into compact arrays; here they are checked and joined: each storage
entry (`MetadataIndex(fqn, offset, index)`) is matched to its key's chunk by the chunk index it names, or, when
that is absent or wrong, by its offsets. A key path comes from `planner_data` (names hold dots, so the flat
key cannot be split reliably).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from inspector.errors import CorruptFileError, UnsupportedCheckpointError
from inspector.format.dcpmeta import MetadataParser, RawMetadata, Rec
from inspector.format.dtypes import DTYPES
from inspector.system.bytesource import ByteSource, open_handle_in
from inspector.text import shown

if TYPE_CHECKING:
    import numpy as np

KNOWN_VERSIONS = (None, "1.0.0")  # None: torch ≤ 2.3 wrote no version
ZSTD = "stream.zstd/1"


@dataclass(frozen=True, slots=True)
class DcpTensor:
    """A tensor key: dtype, global shape, and its chunks as rows `[first, first+count)` of the chunk arrays."""

    key: str
    dtype: str
    shape: tuple[int, ...]
    first: int
    count: int


@dataclass(frozen=True, slots=True)
class DcpBytes:
    """A bytes key (any pickled value): shown by name and size, never unpickled."""

    key: str
    file: str | None
    offset: int
    length: int


@dataclass(frozen=True, slots=True)
class Item:
    """Where one chunk is stored: `[offset, offset+length)` of `file`, through `transforms` (none: raw)."""

    file: str
    offset: int
    length: int
    transforms: tuple[str, ...]


class DcpMetadata:
    """The whole `.metadata`: keys in saved order, planner paths, chunk placement and each chunk's item."""

    def __init__(self, raw: RawMetadata, name: str) -> None:
        import numpy as np

        self.name = name
        self.version = raw.version
        self.planner = raw.planner
        self.tensors: dict[str, DcpTensor] = {}
        self.bytes: dict[str, DcpBytes] = {}
        self.dims = np.frombuffer(raw.chunk_dims, dtype=np.int64) if raw.chunk_dims else np.zeros(0, np.int64)
        self.starts = (
            np.frombuffer(raw.chunk_start, dtype=np.int64) if raw.chunk_start else np.zeros(0, np.int64)
        )
        self.file_names = tuple(raw.file_names)
        self.transforms = tuple(raw.transforms)
        self._keys(raw)
        n, have = len(self.starts), len(raw.item_file)
        if have == n and n:  # every chunk named by index as it was parsed: the parse's arrays, not copied
            self.item_file = np.frombuffer(raw.item_file, dtype=np.int32)
            self.item_offset = np.frombuffer(raw.item_offset, dtype=np.int64)
            self.item_length = np.frombuffer(raw.item_length, dtype=np.int64)
            self.item_transform = np.frombuffer(raw.item_transform, dtype=np.int16)
        else:
            self._items_copied(raw, n, have)
        self.duplicates = raw.duplicates  # storage entries naming a chunk another entry already named
        self.strays = 0  # storage entries naming no chunk of their key
        self._match(raw)

    def _items_copied(self, raw: RawMetadata, n: int, have: int) -> None:
        """Each chunk's item as far as the parse matched them (the rest: -1, no item yet)."""
        import numpy as np

        self.item_file = np.full(n, -1, np.int32)
        self.item_offset = np.zeros(n, np.int64)
        self.item_length = np.zeros(n, np.int64)
        self.item_transform = np.zeros(n, np.int16)
        for mine, theirs, kind in (
            (self.item_file, raw.item_file, np.int32),
            (self.item_offset, raw.item_offset, np.int64),
            (self.item_length, raw.item_length, np.int64),
            (self.item_transform, raw.item_transform, np.int16),
        ):
            if have:
                mine[:have] = np.frombuffer(theirs, dtype=kind)

    def _keys(self, raw: RawMetadata) -> None:
        for key, value in raw.keys.items():
            if isinstance(value, Rec) and value.kind == "BytesStorageMetadata":
                self.bytes[key] = DcpBytes(key, None, 0, 0)
            elif isinstance(value, tuple) and value[:1] == ("tensor",):
                _, dtype, shape, first, count = value
                if dtype not in DTYPES:
                    raise UnsupportedCheckpointError(
                        f"{shown(self.name)}: key {shown(key)} has dtype {shown(dtype)}, which this tool "
                        "does not read.",
                        hint="Convert that tensor with torch in a trusted environment.",
                    )
                self.tensors[key] = DcpTensor(key, dtype, tuple(shape), first, count)
            elif isinstance(value, tuple) and value == ("bytes",):
                self.bytes[key] = DcpBytes(key, None, 0, 0)
            else:
                raise CorruptFileError(
                    f"{shown(self.name)}: key {shown(key)} is neither a tensor nor a bytes entry.",
                    hint="The file is damaged or is not a PyTorch Distributed Checkpoint's .metadata.",
                )

    def ndim(self, key: str) -> int:
        return len(self.tensors[key].shape)

    def chunk(self, row: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """(global offsets, sizes) of chunk `row`."""
        start = int(self.starts[row])
        end = int(self.starts[row + 1]) if row + 1 < len(self.starts) else len(self.dims)
        half = (end - start) // 2
        dims = self.dims[start:end].tolist()
        return tuple(dims[:half]), tuple(dims[half:])

    def item(self, row: int) -> Item | None:
        f = int(self.item_file[row])
        if f < 0:
            return None
        t = self.transforms[int(self.item_transform[row])]
        return Item(self.file_names[f], int(self.item_offset[row]), int(self.item_length[row]), t)

    def _match(self, raw: RawMetadata) -> None:
        """Each storage entry to its chunk: by the index it names when the offsets agree, else by offsets."""
        by_offsets: dict[str, dict[tuple[int, ...], int]] = {}
        dims, dstart = raw.st_dims, raw.st_dim_start
        for i in range(len(raw.st_key)):
            key = raw.key_names[raw.st_key[i]]
            file, off, length = raw.st_file[i], raw.st_offset[i], raw.st_length[i]
            if key in self.bytes:
                self.bytes[key] = DcpBytes(key, raw.file_names[file], off, length)
                continue
            t = self.tensors.get(key)
            if t is None:
                self.strays += 1
                continue
            nd = len(t.shape)
            want = tuple(dims[dstart[i] : dstart[i] + nd])
            row = -1
            hint = raw.st_index[i]
            if 0 <= hint < t.count and self.chunk(t.first + hint)[0] == want:
                row = t.first + hint
            else:
                table = by_offsets.get(key)
                if table is None:
                    table = by_offsets[key] = {self.chunk(r)[0]: r for r in range(t.first, t.first + t.count)}
                row = table.get(want, -1)
            if row < 0:
                self.strays += 1
            elif self.item_file[row] >= 0:
                self.duplicates += 1
            else:
                self.item_file[row] = file
                self.item_offset[row] = off
                self.item_length[row] = length
                self.item_transform[row] = raw.st_transform[i]

    def path_of(self, key: str) -> tuple[str, ...]:
        """The key's path as the saver's nested dict had it (planner_data), or the flat key alone."""
        return self.planner.get(key) or (key,)

    def rows(self, key: str) -> range:
        t = self.tensors[key]
        return range(t.first, t.first + t.count)

    def sizes_array(self) -> np.ndarray:
        return self.dims


def read_metadata(folder: str, source: ByteSource, name: str = ".metadata") -> DcpMetadata:
    """Parse `folder/.metadata` through the confined `source`; refuse an unknown version by name."""
    path = os.path.join(folder, name)
    handle: Any = open_handle_in(path, (source,))
    try:
        raw = MetadataParser(handle.pread, handle.size, shown(path)).parse()
    finally:
        handle.close()
    if raw.version not in KNOWN_VERSIONS:
        raise UnsupportedCheckpointError(
            f"{shown(path)}: a PyTorch Distributed Checkpoint of metadata version {shown(str(raw.version))}; "
            f"this tool reads versions {', '.join(str(v) for v in KNOWN_VERSIONS[1:])} (and the unversioned "
            "metadata of torch ≤ 2.3).",
            hint="Load it with the torch that wrote it (torch.distributed.checkpoint), or update zero-inspector.",
            title="Unknown DCP version",
        )
    return DcpMetadata(raw, shown(path))
