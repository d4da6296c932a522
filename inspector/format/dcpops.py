"""The opcodes of a DCP `.metadata` pickle and the allowlist of globals it may name, for `dcpmeta`'s opcode
machine. Every global is an inert stand-in (a record of DCP's classes, a dtype token, a tuple for torch.Size):
nothing named by the pickle is ever called."""

from __future__ import annotations

import struct
from array import array
from bisect import bisect_left
from collections.abc import Callable, Iterator
from typing import Any

from inspector.errors import UnsafePickleError
from inspector.format.dtypes import DTYPES, TORCH_ALIASES

MetadataParser = Any  # dcpmeta's parser, whose stack, memo and reader the handlers use (no import: a cycle)

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


class Rec:
    """An inert stand-in for one of DCP's dataclasses: its class name and the state BUILD gave it."""

    __slots__ = ("kind", "state")
    state: Any

    def __init__(self, kind: str) -> None:
        self.kind, self.state = kind, None


class Info(Rec):
    """A `_StorageInfo` the fast path read and checked; its state built only if something looks at it."""

    __slots__ = ("fields",)

    def __init__(self, path: str, offset: int, length: int) -> None:
        self.kind, self.fields = "_StorageInfo", (path, offset, length)

    @property
    def state(self) -> dict[str, Any]:  # type: ignore[override]  # read-only: built from the checked fields
        return dict(zip(("relative_path", "offset", "length"), self.fields, strict=True))


class Entry(Rec):
    """A `MetadataIndex` the fast path read and checked, paired with its `Info`: SETITEMS stores it as the
    general machine would stored the two records it stands for, in the same order."""

    __slots__ = ("fields", "info")

    def __init__(self, fqn: str, index: int | None, offset: tuple[int, ...], info: Info) -> None:
        self.kind, self.fields, self.info = "MetadataIndex", (fqn, index, offset), info

    @property
    def state(self) -> dict[str, Any]:  # type: ignore[override]  # read-only: built from the checked fields
        return dict(zip(("fqn", "index", "offset"), self.fields, strict=True))


_MISSING = object()


class Memo:
    """The pickle's memo, compact. Real saves memoize a fresh string per storage entry (each rank's fqn
    objects), 10^6 of them in a 10^6-item file; strings at rising indices (all MEMOIZE gives) are kept as
    two int columns over one copy of each distinct text (12 bytes an entry, not a dict slot, an int and
    a str); anything else, or an index written out of order or again, in a dict that takes precedence."""

    def __init__(self) -> None:
        self.at, self.text = array("q"), array("i")
        self.texts: list[str] = []
        self.ids: dict[str, int] = {}
        self.other: dict[int, Any] = {}
        self.hot: dict[int, Any] = {}  # recent lookups: the few names referred back to again and again

    def __setitem__(self, idx: int, value: Any) -> None:
        self.hot.pop(idx, None)
        if type(value) is str and (not self.at or idx > self.at[-1]) and idx not in self.other:
            got = self.ids.get(value)
            if got is None:
                got = self.ids[value] = len(self.texts)
                self.texts.append(value)
            self.at.append(idx)
            self.text.append(got)
        else:
            self.other[idx] = value

    def get(self, idx: int, default: Any = None) -> Any:
        got = self.hot.get(idx, _MISSING)
        if got is _MISSING:
            got = self.other.get(idx, _MISSING)
        if got is _MISSING:
            k = bisect_left(self.at, idx)
            if k == len(self.at) or self.at[k] != idx:
                return default
            got = self.texts[self.text[k]]
        if len(self.hot) < 4096:
            self.hot[idx] = got
        return got

    def __contains__(self, idx: int) -> bool:
        return self.get(idx, _MISSING) is not _MISSING

    def items(self) -> Iterator[tuple[int, Any]]:
        for idx, t in zip(self.at, self.text, strict=True):
            if idx not in self.other:
                yield idx, self.texts[t]
        yield from self.other.items()


class Token(str):
    """A dtype, layout or memory format, by name."""


class Row(int):
    """A chunk, once built: its row in the chunk arrays."""


class Stand:
    """A global from the allowlist: calling it (NEWOBJ, REDUCE) makes an inert value, never runs code."""

    __slots__ = ("make", "name")

    def __init__(self, make: Callable[..., Any], name: str = "") -> None:
        self.make, self.name = make, name  # the name: which fast-path template may refer back to it


def nat(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool | Row) and 0 <= v < 1 << 62


def ints(state: Any, key: str, optional: bool = False) -> tuple[int, ...]:
    v = state.get(key) if isinstance(state, dict) else None
    if v is None and optional:
        return ()
    if not isinstance(v, tuple) or not all(nat(x) for x in v) or len(v) > 16:
        raise TypeError(f"{key} is not a tuple of whole numbers")
    return v


def intern(ids: dict[str, int], names: list[str], value: str) -> int:
    got = ids.get(value)
    if got is None:
        got = ids[value] = len(names)
        names.append(value)
    return got


def _global(p: MetadataParser, module: str, name: str) -> Stand | Token:
    if (module, name) in _RECORDS:
        return Stand(lambda *a: Rec(name), name)
    if module == "torch" and name == "Size":
        return Stand(lambda dims=(): tuple(dims), "Size")
    if module == "torch" and TORCH_ALIASES.get(name, name) in DTYPES:
        return Token(TORCH_ALIASES.get(name, name))  # a dtype is pickled as the global itself
    if (module, name) in (("torch.serialization", "_get_layout"), (_DCP, "_MEM_FORMAT_ENCODING")):
        return Stand(lambda v=None: Token(f"{name}:{v}"))
    if module == "pathlib" and name in ("PosixPath", "PurePosixPath", "Path"):
        return Stand(lambda *parts: "/".join(str(x) for x in parts))
    if (module, name) == ("collections", "OrderedDict"):
        return Stand(dict)
    shown_name = f"{module}.{name}"
    raise UnsafePickleError(
        f"{p.name}: the metadata pickle asks for `{ascii(shown_name)[1:-1][:120]}`, which is not one of the "
        "classes a PyTorch Distributed Checkpoint's metadata uses. Nothing was executed.",
        hint="If you wrote this checkpoint yourself and trust it, load it with torch; otherwise treat it as hostile.",
    )


def _call(p: MetadataParser, fn: Any, args: Any) -> None:
    if not isinstance(fn, Stand) or not isinstance(args, tuple):
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
    b"h": lambda p: p.get(p.r.read(1)[0]),
    b"j": lambda p: p.get(_U4(p)),
    b"\x8c": lambda p: p.stack.append(p.r.read(p.r.read(1)[0]).decode("utf-8")),
    b"X": lambda p: _string(_U4(p), p, True),
    b"\x8d": lambda p: _string(_U8(p), p, True),
    b"C": lambda p: _string(_U1(p), p, False),
    b"B": lambda p: _string(_U4(p), p, False),
    b"K": lambda p: p.stack.append(p.r.read(1)[0]),
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

KEPT = {Token, Stand, bool, type(None)}
TABLE: list[Callable[[MetadataParser], Any] | None] = [None] * 256
for _op, _fn in _OPS.items():
    TABLE[_op[0]] = _fn
