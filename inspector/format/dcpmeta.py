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
from inspector.format.dtypes import DTYPES, TORCH_ALIASES

_DCP = "torch.distributed.checkpoint.metadata"
_RECORDS = {
    (_DCP, n)
    for n in (
        "Metadata",
        "TensorStorageMetadata",
        "TensorProperties",
        "ChunkStorageMetadata",
        "BytesStorageMetadata",
        "MetadataIndex",
        "StorageMeta",
    )
} | {("torch.distributed.checkpoint.filesystem", "_StorageInfo")}
_BLOCK = 1 << 20
_MAX_RETAINED = 64 << 20  # bytes of strings kept for back-references
_MAX_LOOSE = 4_000_000  # elements of containers not compacted (keys, planner paths, small records)


class Rec:
    """An inert stand-in for one of DCP's dataclasses: its class name and the state BUILD gave it."""

    __slots__ = ("kind", "state")

    def __init__(self, kind: str) -> None:
        self.kind, self.state = kind, None


class Token(str):
    """A dtype, layout or memory format, by name."""


class Row(int):
    """A chunk, once built: its row in the chunk arrays."""


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
    st_key: array = field(default_factory=lambda: array("i"))
    st_index: array = field(default_factory=lambda: array("q"))  # the chunk index hint, -1 when None
    st_dims: array = field(default_factory=lambda: array("q"))  # per storage row: the chunk's offsets
    st_dim_start: array = field(default_factory=lambda: array("q"))
    st_file: array = field(default_factory=lambda: array("i"))
    st_offset: array = field(default_factory=lambda: array("q"))
    st_length: array = field(default_factory=lambda: array("q"))
    st_transform: array = field(default_factory=lambda: array("h"))


class _Reader:
    """The pickle's bytes in blocks from `pread(n, offset)`."""

    def __init__(self, pread: Callable[[int, int], bytes], size: int) -> None:
        self.pread, self.size, self.pos, self.buf, self.at = pread, size, 0, b"", 0

    def read(self, n: int) -> bytes:
        if self.at + n > len(self.buf):
            if self.pos + n - (len(self.buf) - self.at) > self.size:
                raise EOFError
            rest = self.buf[self.at :]
            want = max(n - len(rest), _BLOCK)
            more = self.pread(min(want, self.size - self.pos), self.pos)
            self.pos += len(more)
            self.buf, self.at = rest + more, 0
            if len(self.buf) < n:
                raise EOFError
        out = self.buf[self.at : self.at + n]
        self.at += n
        return out

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

    def __init__(self, pread: Callable[[int, int], bytes], size: int, name: str) -> None:
        self.r, self.name = _Reader(pread, size), name
        self.stack: list[Any] = []
        self.marks: list[int] = []
        self.memo: dict[int, Any] = {}
        self.next_memo = 0
        self.retained = 0
        self.loose = 0
        self.out = RawMetadata()
        self._key_ids: dict[str, int] = {}
        self._file_ids: dict[str, int] = {}
        self._transform_ids: dict[tuple[str, ...], int] = {(): 0}

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
        ops = _OPS
        read = self.r.read
        while True:
            op = read(1)
            handler = ops.get(op)
            if handler is None:
                raise ValueError(f"opcode {op!r} is not one a DCP metadata pickle uses")
            if handler(self) is True:
                return self.stack.pop()

    # ---- memo and containers -------------------------------------------------------------------------
    def memoize(self) -> None:
        self.put(self.next_memo)

    def put(self, idx: int) -> None:
        self.next_memo = max(self.next_memo, idx + 1)
        value = self.stack[-1]
        if isinstance(value, str):
            self.retained += len(value)
            if self.retained > _MAX_RETAINED:
                raise ValueError("more distinct strings than any real metadata holds")
        elif not isinstance(value, _Stand | Token | bool) and value is not None:
            return  # per-item objects: never referred back to by a real pickler; not kept
        self.memo[idx] = value

    def get(self, idx: int) -> None:
        if idx not in self.memo:
            raise UnsafePickleError(
                f"{self.name}: the metadata pickle refers back to an object (memo {idx}) that DCP's pickler "
                "never shares. Nothing was executed.",
                hint="The file is damaged or crafted; copy the checkpoint again from the source.",
            )
        self.stack.append(self.memo[idx])

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
            if isinstance(k, Rec) and k.kind == "MetadataIndex":
                self._storage_row(k, v)
                continue
            if not isinstance(k, str | int | tuple) or isinstance(k, Row):
                raise TypeError("a dict key of an unexpected type")
            self.grow(1)
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
        offsets, sizes = _ints(state, "offsets"), _ints(state, "sizes")
        if len(offsets) != len(sizes):
            raise ValueError("a chunk's offsets and sizes differ in rank")
        out = self.out
        out.chunk_start.append(len(out.chunk_dims))
        out.chunk_dims.extend(offsets)
        out.chunk_dims.extend(sizes)
        return Row(len(out.chunk_start) - 1)

    def _tensor(self, state: Any) -> tuple[Any, ...]:
        if not isinstance(state, dict):
            raise TypeError("a tensor record without a state dict")
        props, size, chunks = state.get("properties"), _ints(state, "size"), state.get("chunks")
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
        fqn, hint, offsets = st.get("fqn"), st.get("index"), _ints(st, "offset", optional=True)
        si = info.state
        if not isinstance(fqn, str) or not isinstance(si, dict):
            raise TypeError("a storage entry without a key name")
        path, off, length = si.get("relative_path"), si.get("offset"), si.get("length")
        if not isinstance(path, str) or not _nat(off) or not _nat(length):
            raise TypeError("a storage entry without a file, offset or length")
        if hint is not None and not _nat(hint):
            raise TypeError("a storage entry with a bad chunk index")
        out = self.out
        out.st_key.append(_intern(self._key_ids, out.key_names, fqn))
        out.st_file.append(_intern(self._file_ids, out.file_names, path))
        tds = si.get("transform_descriptors") or ()
        tds = tuple(str(t) for t in tds) if isinstance(tds, list | tuple) else ("?",)
        if tds not in self._transform_ids:
            self._transform_ids[tds] = len(out.transforms)
            out.transforms.append(tds)
        out.st_transform.append(self._transform_ids[tds])
        out.st_index.append(-1 if hint is None else hint)
        out.st_dim_start.append(len(out.st_dims))
        out.st_dims.extend(offsets)
        out.st_offset.append(off)
        out.st_length.append(length)


class _Stand:
    """A global from the allowlist: calling it (NEWOBJ, REDUCE) makes an inert value, never runs code."""

    __slots__ = ("make",)

    def __init__(self, make: Callable[..., Any]) -> None:
        self.make = make


def _nat(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool | Row) and 0 <= v < 1 << 62


def _ints(state: Any, key: str, optional: bool = False) -> tuple[int, ...]:
    v = state.get(key) if isinstance(state, dict) else None
    if v is None and optional:
        return ()
    if not isinstance(v, tuple) or not all(_nat(x) for x in v) or len(v) > 16:
        raise TypeError(f"{key} is not a tuple of whole numbers")
    return v


def _intern(ids: dict[str, int], names: list[str], value: str) -> int:
    got = ids.get(value)
    if got is None:
        got = ids[value] = len(names)
        names.append(value)
    return got


def _global(p: MetadataParser, module: str, name: str) -> _Stand | Token:
    if (module, name) in _RECORDS:
        return _Stand(lambda *a: Rec(name))
    if module == "torch" and name == "Size":
        return _Stand(lambda dims=(): tuple(dims))
    if module == "torch" and TORCH_ALIASES.get(name, name) in DTYPES:
        return Token(TORCH_ALIASES.get(name, name))  # a dtype is pickled as the global itself
    if (module, name) in (("torch.serialization", "_get_layout"), (_DCP, "_MEM_FORMAT_ENCODING")):
        return _Stand(lambda v=None: Token(f"{name}:{v}"))
    if module == "pathlib" and name in ("PosixPath", "PurePosixPath", "Path"):
        return _Stand(lambda *parts: "/".join(str(x) for x in parts))
    if (module, name) == ("collections", "OrderedDict"):
        return _Stand(dict)
    shown_name = f"{module}.{name}"
    raise UnsafePickleError(
        f"{p.name}: the metadata pickle asks for `{ascii(shown_name)[1:-1][:120]}`, which is not one of the "
        "classes a PyTorch Distributed Checkpoint's metadata uses. Nothing was executed.",
        hint="If you wrote this checkpoint yourself and trust it, load it with torch; otherwise treat it as hostile.",
    )


def _call(p: MetadataParser, fn: Any, args: Any) -> None:
    if not isinstance(fn, _Stand) or not isinstance(args, tuple):
        raise TypeError("a call of something that is not an allowed class")
    p.stack.append(fn.make(*args))


def _u(fmt: str, n: int) -> Callable[[MetadataParser], int]:
    return lambda p: struct.unpack(fmt, p.r.read(n))[0]  # type: ignore[no-any-return]


_U1, _U2, _U4, _I4, _U8 = _u("<B", 1), _u("<H", 2), _u("<I", 4), _u("<i", 4), _u("<Q", 8)


def _string(n: int, p: MetadataParser, text: bool) -> None:
    if n > 1 << 20:
        raise ValueError("a string longer than any name in real metadata")
    raw = p.r.read(n)
    p.stack.append(raw.decode("utf-8") if text else raw)


def _stack_global(p: MetadataParser) -> None:
    name, module = p.stack.pop(), p.stack.pop()
    if not isinstance(name, str) or not isinstance(module, str):
        raise TypeError("STACK_GLOBAL of names that are not strings")
    p.stack.append(_global(p, module, name))


def _text_global(p: MetadataParser) -> None:
    module, name = p.r.line().decode("ascii"), p.r.line().decode("ascii")
    p.stack.append(_global(p, module, name))


def _tuple(p: MetadataParser, n: int) -> None:
    items = tuple(p.stack[-n:]) if n else ()
    if n:
        del p.stack[-n:]
    p.stack.append(items)


def _appends(p: MetadataParser) -> None:
    items = p.pop_mark()
    target = p.stack[-1]
    if not isinstance(target, list):
        raise TypeError("APPENDS on something that is not a list")
    p.grow(sum(1 for i in items if not isinstance(i, Row)))
    target.extend(items)


def _append(p: MetadataParser) -> None:
    item = p.stack.pop()
    if not isinstance(p.stack[-1], list):
        raise TypeError("APPEND on something that is not a list")
    p.grow(0 if isinstance(item, Row) else 1)
    p.stack[-1].append(item)


def _newobj(p: MetadataParser) -> None:
    args, cls = p.stack.pop(), p.stack.pop()
    _call(p, cls, args)


def _reduce(p: MetadataParser) -> None:
    args, fn = p.stack.pop(), p.stack.pop()
    _call(p, fn, args)


def _setitem(p: MetadataParser) -> None:
    v, k = p.stack.pop(), p.stack.pop()
    p.setitems(p.stack[-1], [k, v])


def _setitems(p: MetadataParser) -> None:
    items = p.pop_mark()
    p.setitems(p.stack[-1], items)


def _proto(p: MetadataParser) -> None:
    if _U1(p) > 5:
        raise ValueError("an unknown pickle protocol")


_OPS: dict[bytes, Callable[[MetadataParser], Any]] = {
    b"\x80": _proto,
    b"\x95": lambda p: p.r.read(8) and None,
    b".": lambda p: True,
    b"(": lambda p: p.marks.append(len(p.stack)),
    b"}": lambda p: p.stack.append({}),
    b"]": lambda p: p.stack.append([]),
    b")": lambda p: p.stack.append(()),
    b"t": lambda p: p.stack.append(tuple(p.pop_mark())),
    b"\x85": lambda p: _tuple(p, 1),
    b"\x86": lambda p: _tuple(p, 2),
    b"\x87": lambda p: _tuple(p, 3),
    b"l": lambda p: p.stack.append(p.pop_mark()),
    b"\x94": lambda p: p.memoize(),
    b"q": lambda p: p.put(_U1(p)),
    b"r": lambda p: p.put(_U4(p)),
    b"h": lambda p: p.get(_U1(p)),
    b"j": lambda p: p.get(_U4(p)),
    b"\x8c": lambda p: _string(_U1(p), p, True),
    b"X": lambda p: _string(_U4(p), p, True),
    b"\x8d": lambda p: _string(_U8(p), p, True),
    b"C": lambda p: _string(_U1(p), p, False),
    b"B": lambda p: _string(_U4(p), p, False),
    b"K": lambda p: p.stack.append(_U1(p)),
    b"M": lambda p: p.stack.append(_U2(p)),
    b"J": lambda p: p.stack.append(_I4(p)),
    b"\x8a": lambda p: p.stack.append(int.from_bytes(p.r.read(_U1(p)), "little", signed=True)),
    b"N": lambda p: p.stack.append(None),
    b"\x88": lambda p: p.stack.append(True),
    b"\x89": lambda p: p.stack.append(False),
    b"G": lambda p: p.stack.append(struct.unpack(">d", p.r.read(8))[0]),
    b"\x93": _stack_global,
    b"c": _text_global,
    b"\x81": _newobj,
    b"R": _reduce,
    b"b": lambda p: p.build(),
    b"s": _setitem,
    b"u": _setitems,
    b"a": _append,
    b"e": _appends,
}
