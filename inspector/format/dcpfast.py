"""The fast path of `dcpmeta`'s opcode machine: the two records a DCP `.metadata` repeats once per chunk.

A 10^6-item `.metadata` is ~3x10^7 opcodes; one Python dispatch each took minutes. Python's pickler writes
every `ChunkStorageMetadata` and every `MetadataIndex -> _StorageInfo` entry with the same opcodes, only the
numbers and names differ, and refers back to the class and field names by memo index. Once the general
machine has memoized those (checked by value, `note`), each record is matched as a whole by one compiled
pattern of literal opcodes whose only free parts are integers, `torch.Size` bodies and names.

A record is taken here only when everything in it passes the same checks the general machine makes (whole
numbers in range, at most 16 dims, a tuple opcode that fits its count); anything else (another field order,
a FRAME inside the record, a value out of range, a crafted byte) is left to the general machine, which reads
it opcode by opcode and refuses it with its own words. Both paths leave the same memo and the same rows.
"""

from __future__ import annotations

import re
import struct
from typing import Any

from inspector.format.dcpops import Entry, Info, Stand

_LONG = b"|".join(b"\x8a" + bytes([k]) + b"." * k for k in range(1, 9))
_INT = b"(?:K.|M..|J....|" + _LONG + b")"
_TUPLE = b"(\\)|" + _INT + b"{1,3}[\\x85-\\x87]\\x94|\\(" + _INT + b"{4,16}t\\x94)\\x85\\x94R\\x94"
_NAME = b"(?:\\x8c(.)(.{0,255}?)\\x94|(h.|j....))"  # a fresh short string, memoized, or a reference back
_NEW = b"\\)\\x81\\x94\\}\\x94\\("  # NEWOBJ of no arguments, memoized; its state dict, memoized; MARK
_CAP = 1 << 14  # distinct torch.Size bodies remembered (one per rank offset and shape), ~3 MB at most
_TOP = 1 << 62
_WIDTH = {75: 2, 77: 3, 74: 5, 0x8A: 0}  # bytes an integer opcode takes (LONG1: 2 + its length byte)

_G, _S = "g", "s"
_CHUNK = ((_G, "ChunkStorageMetadata"), (_G, "Size"), (_S, "offsets"), (_S, "sizes"))
_ENTRY = (
    (_G, "MetadataIndex"),
    (_G, "_StorageInfo"),
    (_G, "Size"),
    (_S, "fqn"),
    (_S, "index"),
    (_S, "offset"),
    (_S, "relative_path"),
    (_S, "length"),
)
_WANTED = frozenset(_CHUNK + _ENTRY)


def _ref(idx: int) -> bytes:
    """How Python's pickler refers back to memo `idx` (BINGET below 256, else LONG_BINGET), as a pattern."""
    return re.escape(b"h" + bytes([idx]) if idx < 256 else b"j" + struct.pack("<I", idx))


def _int(op: bytes) -> int:
    """The integer of one K, M, J or LONG1 opcode (whole, as the pattern matched it)."""
    c = op[0]
    if c == 75:
        return op[1]
    return int.from_bytes(op[2:] if c == 0x8A else op[1:], "little", signed=c != 77)


def _dims(body: bytes) -> tuple[int, ...] | None:
    """A torch.Size body as the general machine would build it, or None where it would not (or refuse)."""
    if body == b")":
        return ()
    marked = body[0] == 40
    at, end, out = int(marked), len(body) - 2, []
    while at < end:
        n = _WIDTH[body[at]] or 2 + body[at + 1]
        out.append(_int(body[at : at + n]))
        at += n
    if body[-2] != (116 if marked else 0x84 + len(out)) or not all(0 <= v < _TOP for v in out):
        return None
    return tuple(out)


class FastPath:
    """Whole-record patterns for one parser, compiled once the names they refer back to are memoized."""

    def __init__(self, parser: Any, enabled: bool = True) -> None:
        self.p, self.enabled = parser, enabled  # disabled: the general machine alone (tests compare the two)
        self.taken = 0  # records read here
        self.refs: dict[tuple[str, str], int] = {}
        self.chunk: re.Pattern[bytes] | None = None
        self.entry: re.Pattern[bytes] | None = None
        self.sizes: dict[bytes, tuple[int, ...] | None] = {}
        self.names: dict[bytes, str] = {}  # a reference back, as written, to the string it names
        self.ready = False  # both templates compiled: `note` has nothing left to look for

    def note(self, idx: int, value: Any) -> None:
        """Memo `idx` now holds `value`: remember it when a template refers back to it."""
        if self.ready or not self.enabled:
            return
        key = (_G, value.name) if isinstance(value, Stand) else (_S, value)
        if key in _WANTED and key not in self.refs:
            self.refs[key] = idx
            self._compile()

    def forget(self, idx: int) -> None:
        """Memo `idx` was written again: no template may refer back to it any longer."""
        self.names.clear()
        if idx in self.refs.values():
            self.refs = {k: v for k, v in self.refs.items() if v != idx}
            self.chunk = self.entry = None
            self.ready = False

    def _compile(self) -> None:
        r = {k[1]: _ref(v) for k, v in self.refs.items()}
        size = r.get("Size", b"") + _TUPLE
        if self.chunk is None and all(k in self.refs for k in _CHUNK):
            pattern = r["ChunkStorageMetadata"] + _NEW + r["offsets"] + size + r["sizes"] + size + b"ub"
            self.chunk = re.compile(pattern, re.DOTALL)
        if self.entry is None and all(k in self.refs for k in _ENTRY):
            pattern = b"".join((
                r["MetadataIndex"], _NEW, r["fqn"], _NAME,
                r["index"], b"(", _INT, b"|N)", r["offset"], size, b"ub", r["_StorageInfo"], _NEW,
                r["relative_path"], _NAME, r["offset"], b"(", _INT, b")", r["length"], b"(", _INT, b")ub",
            ))  # fmt: skip
            self.entry = re.compile(pattern, re.DOTALL)
        self.ready = self.chunk is not None and self.entry is not None

    def run(self) -> bool:
        """Take as many whole records as match at the read position; False when none did."""
        r, took = self.p.r, 0
        while True:
            got = self._chunks(r) + self._entries(r)
            if not got:
                self.taken += took
                return took > 0
            took += got

    def _room(self, r: Any) -> None:
        """A whole record buffered from the read position on (records are far below 4 KiB), or the file's end."""
        if len(r.buf) - r.at < 4096 and r.pos < r.size:
            r.fill(min(4096, len(r.buf) - r.at + r.size - r.pos))

    def _size(self, body: bytes) -> tuple[int, ...] | None:
        got = self.sizes.get(body, self)
        if got is self:
            got = _dims(body)
            if len(self.sizes) < _CAP:
                self.sizes[body] = got
        return got  # type: ignore[return-value]

    def _chunks(self, r: Any) -> int:
        """Consecutive ChunkStorageMetadata records, each pushed as its row as BUILD would."""
        pattern, p, size, got = self.chunk, self.p, self._size, 0
        if pattern is None:
            return 0
        push, add = p.stack.append, p.add_chunk
        while True:
            self._room(r)
            m = pattern.match(r.buf, r.at)
            if m is None:
                return got
            a, b = m.group(1, 2)
            offsets, sizes = size(a), size(b)
            if offsets is None or sizes is None or len(offsets) != len(sizes):
                return got
            p.next_memo += 6 + (a != b")") + (b != b")")  # the record, its state, each Size's two or three
            r.at = m.end()
            push(add(offsets, sizes))
            got += 1

    def _entries(self, r: Any) -> int:
        """Consecutive MetadataIndex -> _StorageInfo pairs, taken where the general machine would take them
        as a dict's key and value: at a key's place after a MARK, the dict being filled below it."""
        pattern, p, got = self.entry, self.p, 0
        if pattern is None:
            return 0
        marks, stack = p.marks, p.stack
        at = marks[-1] if marks else 0
        if not at or (len(stack) - at) % 2 or type(stack[at - 1]) is not dict:
            return 0
        name, size, push, keep = self._name, self._size, stack.append, p.keep
        while True:
            self._room(r)
            m = pattern.match(r.buf, r.at)
            if m is None:
                return got
            n1, s1, ref1, hint_op, body, n2, s2, ref2, off_op, length_op = m.groups()
            fqn, path, offsets = name(n1, s1, ref1), name(n2, s2, ref2), size(body)
            if fqn is None or path is None or offsets is None:
                return got
            hint = None if hint_op == b"N" else _int(hint_op)
            off, length = _int(off_op), _int(length_op)
            if not (0 <= off < _TOP and 0 <= length < _TOP and (hint is None or 0 <= hint < _TOP)):
                return got
            # memoized in the general machine's order: the record, its state, [fqn], the Size, the second
            # record, its state, [path]
            p.next_memo += 2
            if ref1 is None:
                keep(fqn)
            p.next_memo += 4 + (body != b")")
            if ref2 is None:
                keep(path)
            r.at = m.end()
            info = Info(path, off, length)
            push(Entry(fqn, hint, offsets, info))
            push(info)
            got += 1

    def _name(self, n: bytes | None, text: bytes | None, ref: bytes | None) -> str | None:
        """A fresh short string of the length it says, or a reference back to a string; else None."""
        if ref is not None:
            got = self.names.get(ref)
            if got is None:
                value = self.p.memo.get(ref[1] if ref[0] == 104 else struct.unpack_from("<I", ref, 1)[0])
                if type(value) is not str:
                    return None
                got = value
                if len(self.names) < 4096:
                    self.names[ref] = got
            return got
        if text is None or n is None or len(text) != n[0]:
            return None
        try:
            return text.decode("utf-8")
        except UnicodeDecodeError:
            return None
