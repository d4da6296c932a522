"""A PyTorch Distributed Checkpoint's `.metadata` pickle, read streaming into compact arrays.

`.metadata` is one pickle of `Metadata` (FORMAT.md, DCP section): ~240 bytes per item, and a 70B model on 512
ranks has ~1.1M items. Unpickled as Python objects that is over 1 GB; here a small opcode machine reads it in
blocks, turns each chunk and each storage entry into rows of `array`s as soon as it is built, and keeps in its
memo only what a real pickler refers back to (strings, classes, dtypes). Nothing is ever called: every global
is an inert stand-in from a short allowlist, and a reference back to anything else is refused.
"""

from __future__ import annotations

import struct
from array import array
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from inspector.errors import CorruptFileError, UnsafePickleError
from inspector.format.dcpfast import FastPath
from inspector.format.dcpops import KEPT, TABLE, Entry, Memo, Rec, Row, Stand, Token, intern, ints, nat

__all__ = ["MetadataParser", "RawMetadata", "Rec", "Row", "Token"]

_BLOCK = 1 << 20
_MAX_RETAINED = 64 << 20  # bytes charged for strings kept for back-references
_MAX_STACK = 1_000_000  # real metadata stacks a few thousand values at most (SETITEMS batches of 1000)
_MAX_LOOSE = 4_000_000  # elements of containers not compacted (keys, planner paths, small records)


@dataclass
class RawMetadata:
    """What `.metadata` holds, compacted: per key, its record; per chunk and per storage entry, array rows."""

    keys: dict[str, Any] = field(
        default_factory=dict
    )  # key -> ("tensor", dtype, size, first, count) | ("bytes",)
    planner: dict[str, tuple[str, ...]] = field(default_factory=dict)
    version: str | None = None
    chunk_dims: array = field(default_factory=lambda: array("q"))  # per chunk: offsets then sizes
    chunk_start: array = field(default_factory=lambda: array("q"))  # where each chunk's dims begin
    key_names: list[str] = field(default_factory=list)  # storage rows name keys by index
    file_names: list[str] = field(default_factory=list)
    transforms: list[tuple[str, ...]] = field(default_factory=lambda: [()])
    # per chunk, its item, filled when a storage entry names the chunk by its index (torch always does)
    item_file: array = field(default_factory=lambda: array("i"))  # -1: no entry named it yet
    item_offset: array = field(default_factory=lambda: array("q"))
    item_length: array = field(default_factory=lambda: array("q"))
    item_transform: array = field(default_factory=lambda: array("h"))
    duplicates: int = 0  # entries naming a chunk another entry already named
    # the other storage entries (bytes items; no index, or a wrong one), matched by offsets in parse/dcp.py
    st_key: array = field(default_factory=lambda: array("i"))
    st_index: array = field(default_factory=lambda: array("q"))  # the chunk index hint, -1 when None
    st_dims: array = field(default_factory=lambda: array("q"))  # per storage row: the chunk's offsets
    st_dim_start: array = field(default_factory=lambda: array("q"))
    st_file: array = field(default_factory=lambda: array("i"))
    st_offset: array = field(default_factory=lambda: array("q"))
    st_length: array = field(default_factory=lambda: array("q"))
    st_transform: array = field(default_factory=lambda: array("h"))


class _Reader:
    """The pickle's bytes in blocks from `pread(n, offset)`; `buf[at:]` is what is not consumed yet."""

    def __init__(self, pread: Callable[[int, int], bytes], size: int) -> None:
        self.pread, self.size, self.pos, self.buf, self.at = pread, size, 0, b"", 0
        self.on_fill: Callable[[], None] = lambda: None

    def read(self, n: int) -> bytes:
        at = self.at
        end = at + n
        if end <= len(self.buf):
            self.at = end
            return self.buf[at:end]
        self.fill(n)
        return self.read(n)

    def fill(self, n: int) -> None:
        """At least `n` bytes buffered from `at` on, or EOFError."""
        rest = self.buf[self.at :]
        if self.pos + n - len(rest) > self.size:
            raise EOFError
        more = self.pread(min(max(n - len(rest), _BLOCK), self.size - self.pos), self.pos)
        self.pos += len(more)
        self.buf, self.at = rest + more, 0
        if len(self.buf) < n:
            raise EOFError
        self.on_fill()

    def line(self) -> bytes:
        out = b""
        while (c := self.read(1)) != b"\n":
            out += c
            if len(out) > 256:
                raise ValueError("a text line longer than any global name")
        return out


_MARK = object()


class MetadataParser:
    """The opcode machine. `parse()` returns the compacted record or raises a `CorruptFileError`."""

    def __init__(self, pread: Callable[[int, int], bytes], size: int, name: str, fast: bool = True) -> None:
        self.r: _Reader = _Reader(pread, size)
        self.name = name
        self.r.on_fill = self._bound_stack  # a block holds at most a million pushes: checked once per block
        self.stack: list[Any] = []
        self.marks: list[int] = []
        self.memo = Memo()
        self.next_memo = 0
        self.retained = 0
        self.loose = 0
        self.out = RawMetadata()
        self._key_ids: dict[str, int] = {}
        self._file_ids: dict[str, int] = {}
        self._transform_ids: dict[tuple[str, ...], int] = {(): 0}
        self._tensors: dict[str, tuple[Any, ...]] = {}
        self.fast = FastPath(self, fast)

    def parse(self) -> RawMetadata:
        try:
            top = self._run()
        except (EOFError, IndexError, ValueError, TypeError, KeyError, struct.error, MemoryError) as exc:
            raise CorruptFileError(
                f"{self.name}: the metadata pickle cannot be read ({type(exc).__name__}: {str(exc)[:120]}).",
                hint="The file is damaged or is not a PyTorch Distributed Checkpoint's .metadata.",
            ) from None
        if not isinstance(top, Rec) or top.kind != "Metadata" or not isinstance(top.state, dict):
            raise CorruptFileError(
                f"{self.name}: the pickle is not a DCP Metadata record.",
                hint="The file is damaged or is not a PyTorch Distributed Checkpoint's .metadata.",
            )
        self._finish(top.state)
        return self.out

    def _finish(self, state: dict[str, Any]) -> None:
        sdm = state.get("state_dict_metadata")
        if not isinstance(sdm, dict):
            raise TypeError("state_dict_metadata is not a dict")
        for key, value in sdm.items():
            self.out.keys[str(key)] = value
        planner = state.get("planner_data")
        if isinstance(planner, dict):
            self.out.planner = {
                str(k): tuple(str(p) for p in v) for k, v in planner.items() if isinstance(v, tuple | list)
            }
        version = state.get("version")
        self.out.version = str(version) if version is not None else None

    def _run(self) -> Any:
        table, r, fast = TABLE, self.r, self.fast
        while True:
            if r.at >= len(r.buf):
                r.fill(1)
            op = r.buf[r.at]
            if op in (104, 106) and (fast.chunk or fast.entry) and fast.run():  # BINGET: a record begins?
                continue
            r.at += 1
            handler = table[op]
            if handler is None:
                raise ValueError(f"opcode {bytes([op])!r} is not one a DCP metadata pickle uses")
            if handler(self) is True:
                return self.stack.pop()

    def _bound_stack(self) -> None:
        if len(self.stack) > _MAX_STACK:
            raise ValueError("a deeper pickle stack than any real metadata builds")

    # ---- memo and containers -------------------------------------------------------------------------
    def memoize(self) -> None:
        self.put(self.next_memo)

    def put(self, idx: int) -> None:
        fresh = idx >= self.next_memo  # past every index written so far: nothing to overwrite
        self.next_memo = max(self.next_memo, idx + 1)
        value = self.stack[-1]
        kind = type(value)
        if kind is str:
            self.keep(value, idx, fresh)
            return
        if kind not in KEPT:
            return  # per-item objects: never referred back to by a real pickler; not kept
        self.retained += 16  # a dict slot: charged, or `N MEMOIZE` pairs would grow the memo freely
        if self.retained > _MAX_RETAINED:
            raise ValueError("more memoized values than any real metadata holds")
        if not fresh and idx in self.memo:
            self.fast.forget(idx)
        self.memo[idx] = value
        if kind is Stand:
            self.fast.note(idx, value)

    def keep(self, value: str, idx: int = -1, fresh: bool = True) -> None:
        """A string memoized at `idx` (MEMOIZE: the next index), charged 16 bytes and its text when new."""
        memo = self.memo
        if idx < 0:
            idx = self.next_memo  # past every index written so far: nothing to overwrite
            self.next_memo += 1
        elif not fresh and idx in memo:
            self.fast.forget(idx)
        self.retained += 16 if value in memo.ids else 16 + len(value)
        if self.retained > _MAX_RETAINED:
            raise ValueError("more strings than any real metadata holds")
        self.memo[idx] = value
        self.fast.note(idx, value)

    def get(self, idx: int) -> None:
        value = self.memo.get(idx, self)
        if value is self:
            raise UnsafePickleError(
                f"{self.name}: the metadata pickle refers back to an object (memo {idx}) that DCP's pickler "
                "never shares. Nothing was executed.",
                hint="The file is damaged or crafted; copy the checkpoint again from the source.",
            )
        self.stack.append(value)

    def pop_mark(self) -> list[Any]:
        at = self.marks.pop()
        items = self.stack[at:]
        del self.stack[at:]
        return items

    def grow(self, n: int) -> None:
        self.loose += n
        if self.loose > _MAX_LOOSE:
            raise ValueError("more entries than any real metadata holds")

    def setitems(self, target: Any, items: list[Any]) -> None:
        if len(items) % 2:
            raise ValueError("SETITEMS with an odd number of items")
        if not isinstance(target, dict):
            raise TypeError("SETITEMS on something that is not a dict")
        for k, v in zip(items[::2], items[1::2], strict=True):
            if type(k) is Entry and k.info is v:  # checked by the fast path
                self.store(*k.fields, *v.fields, ())
                continue
            if isinstance(k, Rec) and k.kind == "MetadataIndex":
                self._storage_row(k, v)
                continue
            if not isinstance(k, str | int | tuple) or isinstance(k, Row):
                raise TypeError("a dict key of an unexpected type")
            if len(target) >= 16:  # a record's few fields are not counted: it is consumed at BUILD
                self.grow(1)
            if type(k) is str and type(v) is tuple and v[:1] == ("tensor",):
                self._tensors[k] = v  # state_dict_metadata: each key's chunk rows, for its storage entries
            target[k] = v

    # ---- records ------------------------------------------------------------------------------------
    def build(self) -> None:
        state = self.stack.pop()
        obj = self.stack[-1]
        if not isinstance(obj, Rec) or obj.state is not None:
            raise TypeError("BUILD on something that is not a fresh DCP record")
        obj.state = state
        if obj.kind == "ChunkStorageMetadata":
            self.stack[-1] = self._chunk(state)
        elif obj.kind == "TensorStorageMetadata":
            self.stack[-1] = self._tensor(state)
        elif obj.kind == "BytesStorageMetadata":
            self.stack[-1] = ("bytes",)

    def _chunk(self, state: Any) -> Row:
        offsets, sizes = ints(state, "offsets"), ints(state, "sizes")
        if len(offsets) != len(sizes):
            raise ValueError("a chunk's offsets and sizes differ in rank")
        return self.add_chunk(offsets, sizes)

    def add_chunk(self, offsets: tuple[int, ...], sizes: tuple[int, ...]) -> Row:
        """A checked chunk's row (offsets and sizes whole numbers, of one rank)."""
        out = self.out
        out.chunk_start.append(len(out.chunk_dims))
        out.chunk_dims.extend(offsets)
        out.chunk_dims.extend(sizes)
        return Row(len(out.chunk_start) - 1)

    def _tensor(self, state: Any) -> tuple[Any, ...]:
        if not isinstance(state, dict):
            raise TypeError("a tensor record without a state dict")
        props, size, chunks = state.get("properties"), ints(state, "size"), state.get("chunks")
        dtype = props.state[0] if isinstance(props, Rec) and isinstance(props.state, tuple) else None
        if isinstance(props, Rec) and isinstance(props.state, dict):
            dtype = props.state.get("dtype")
        if not isinstance(dtype, Token) or not isinstance(chunks, list):
            raise TypeError("a tensor record without a dtype or chunk list")
        rows = [int(c) for c in chunks if isinstance(c, Row)]
        if len(rows) != len(chunks) or rows != list(range(rows[0], rows[0] + len(rows)) if rows else []):
            raise ValueError("a tensor's chunks are not its own")
        return ("tensor", str(dtype), size, rows[0] if rows else 0, len(rows))

    def _storage_row(self, index: Rec, info: Any) -> None:
        st = index.state
        if not isinstance(st, dict) or not isinstance(info, Rec) or info.kind != "_StorageInfo":
            raise TypeError("a storage entry that is not MetadataIndex -> _StorageInfo")
        fqn, hint, offsets = st.get("fqn"), st.get("index"), ints(st, "offset", optional=True)
        si = info.state
        if not isinstance(fqn, str) or not isinstance(si, dict):
            raise TypeError("a storage entry without a key name")
        path, off, length = si.get("relative_path"), si.get("offset"), si.get("length")
        if not isinstance(path, str) or not nat(off) or not nat(length):
            raise TypeError("a storage entry without a file, offset or length")
        if hint is not None and not nat(hint):
            raise TypeError("a storage entry with a bad chunk index")
        tds = si.get("transform_descriptors") or ()
        tds = tuple(str(t) for t in tds) if isinstance(tds, list | tuple) else ("?",)
        self.store(fqn, hint, offsets, path, off, length, tds)  # type: ignore[arg-type]  # nat(): ints

    def store(
        self, fqn: str, hint: int | None, offsets: tuple[int, ...], path: str, off: int, length: int,
        tds: tuple[str, ...],
    ) -> None:  # fmt: skip
        """A checked storage entry: into its chunk's item columns, or the rows matched later by offsets."""
        out = self.out
        file = intern(self._file_ids, out.file_names, path)
        if tds not in self._transform_ids:
            self._transform_ids[tds] = len(out.transforms)
            out.transforms.append(tds)
        transform = self._transform_ids[tds]
        row = self._named_chunk(fqn, hint, offsets)
        if row >= 0:
            if out.item_file[row] >= 0:
                out.duplicates += 1
                return
            out.item_file[row], out.item_offset[row], out.item_length[row] = file, off, length
            out.item_transform[row] = transform
            return
        out.st_key.append(intern(self._key_ids, out.key_names, fqn))
        out.st_file.append(file)
        out.st_transform.append(transform)
        out.st_index.append(-1 if hint is None else hint)
        out.st_dim_start.append(len(out.st_dims))
        out.st_dims.extend(offsets)
        out.st_offset.append(off)
        out.st_length.append(length)

    def _named_chunk(self, fqn: str, hint: int | None, offsets: tuple[int, ...]) -> int:
        """The chunk row a storage entry names by its key and index, when its offsets agree; else -1."""
        t = self._tensors.get(fqn)
        if t is None or hint is None or not 0 <= hint < t[4]:
            return -1
        out, row = self.out, t[3] + hint
        start = out.chunk_start[row]
        if tuple(out.chunk_dims[start : start + len(offsets)]) != offsets or len(offsets) != len(t[2]):
            return -1
        if len(out.item_file) < len(out.chunk_start):  # chunks parsed since: no item yet
            grow = len(out.chunk_start) - len(out.item_file)
            out.item_file.extend([-1] * grow)
            out.item_offset.extend([0] * grow)
            out.item_length.extend([0] * grow)
            out.item_transform.extend([0] * grow)
        return row
