"""A DCP item that repeats, byte for byte, one already read: its tensor without reading it again.

Every item of a save is a `torch.save` archive of one chunk, and the chunks of one shape are archives that
differ only in their tensor bytes: the same local headers, `data.pkl`, `byteorder` and padding up to the
tensor's bytes (the head), and the same directory and end records after them but for the CRC-32 fields of
the members no check reads (the tensor's, the serialization id's). 1,024 ranks of 24 items read the same
~660 bytes of directory and unpickled the same 157-byte pickle 24,576 times.

What the zip reader and the unpickler decide about an item (the end record it takes, every directory check,
each local header's offsets and bounds, `data.pkl`'s and `byteorder`'s CRC-32, the pickle's guards, the
view check) is a function of exactly those bytes and the item's length. So an item of a length seen before
whose head is the earlier item's and whose directory and end records are the earlier item's apart from
those CRC fields gets the earlier item's answer, its storage moved to where this item is: every check's
verdict is the one it earned the first time on the same bytes. Anything else (another layout, damage
anywhere in what is compared) is read in full by `torchzip.load` and refused there in its own words.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any

from inspector.errors import InspectorError
from inspector.format.readahead import ReadAhead
from inspector.format.torchzip import load
from inspector.format.views import StorageRef, TensorRef
from inspector.format.zipreader import TorchZip

_CDIR = struct.Struct("<28xHHH")  # a directory record's name, extra and comment lengths
# item lengths remembered (the oldest forgotten first): a model's chunks come in a few shapes
_MAX_LENGTHS = 64
_PER_LENGTH = 4  # items of one length but another shape or dtype
_MAX_PART = 8 << 10  # bytes of a head or a tail kept (a real item's are under 1 KiB): 4 MiB in all at most


@dataclass(frozen=True, slots=True)
class _Repeat:
    """What an item proved, and the bytes that proved it: the head, and the directory and end records
    (`tail`) whose `kept` spans (all but unread members' CRC fields) must be equal."""

    head: bytes
    tail: bytes
    kept: tuple[tuple[int, int], ...]
    masked: bytes
    tensor: TensorRef  # the item's tree: its storage's offset taken from the item's start

    def tail_matches(self, tail: bytes) -> bool:
        """Whether `tail` is this item's directory and end records but for unread members' CRC fields."""
        return len(tail) == len(self.tail) and b"".join([tail[a:b] for a, b in self.kept]) == self.masked


class Repeats:
    """The items of one scan read so far, by length; bounded (a save's chunks come in a few shapes), and
    dropped with the scan."""

    def __init__(self) -> None:
        self._by_length: dict[int, list[_Repeat]] = {}
        self._head = 0  # the shortest head learnt: read with an item's tail, past its end (the next one's)
        self._past: tuple[Any, int, bytes] = (None, 0, b"")  # (file, where, bytes) read past the last end

    def read(self, ahead: ReadAhead, path: str, base: int, length: int) -> tuple[Any, int]:
        """(tree, shift) of the item at `[base, base+length)` of the file `ahead` reads: its object tree as
        `torchzip.load` gives it, with every check, its tensors' offsets `shift` bytes short of where they are
        in this file. A repeat of an item read before is answered by that item's tree with its offsets taken
        from the item's start (shift `base`); an item read in full is its own (shift 0)."""
        known = self._by_length.get(length, ())
        if known and base >= 0 and base + length <= ahead.size:
            for repeat in known:
                if self._head_of(ahead, base, len(repeat.head)) != repeat.head:
                    continue
                end = base + length
                tail = ahead.inner.pread(len(repeat.tail) + self._head, end - len(repeat.tail))
                self._past = (ahead, end, tail[len(repeat.tail) :])
                if repeat.tail_matches(tail[: len(repeat.tail)]):
                    return repeat.tensor, base
        tree, archive = load(path, window=(base, length), handle=ahead.archive(base, length))
        try:
            if len(known) < _PER_LENGTH and isinstance(archive, TorchZip):
                self._learn(length, tree, archive)
        finally:
            archive.close()
        return tree, 0

    def _head_of(self, ahead: ReadAhead, base: int, n: int) -> bytes:
        """An item's first `n` bytes: read with the tail of the item before it when it starts where that one
        ends (a file's items lie end to end), else read now. What is read past an item's end is the
        shortest head learnt: the next item's head, when it is of a form seen before."""
        file, at, past = self._past
        if file is ahead and at == base and n <= len(past):
            return past[:n]
        return ahead.inner.pread(n, base)

    def _learn(self, length: int, tree: Any, archive: TorchZip) -> None:
        try:
            repeat = _repeat(tree, archive)
        except InspectorError:  # the file changed under the read: nothing learnt, the item stands as read
            return
        if repeat is None:
            return
        if length not in self._by_length and len(self._by_length) >= _MAX_LENGTHS:
            self._by_length.pop(next(iter(self._by_length)))
        self._by_length.setdefault(length, []).append(repeat)
        heads = [len(r.head) for rs in self._by_length.values() for r in rs]
        self._head = min(heads)


def _repeat(tree: Any, archive: TorchZip) -> _Repeat | None:
    """The repeat of an archive just read in full: None when what its checks read is not all inside its head
    and its directory and end records (so a repeat could not stand for it)."""
    storages = archive.storages()
    if type(tree) is not TensorRef or tree.attrs or len(storages) != 1:
        return None
    end = archive.end_directory()
    if end is None:
        return None
    count, _, cd_off, _ = end
    prefix = archive.prefix
    head_len = tree.storage.offset - archive.base  # the tensor's bytes start: every member read lies before
    read = [n for n in (f"{prefix}data.pkl", f"{prefix}byteorder") if n in archive.entries]
    if any(archive.data_offset(n) - archive.base + archive.entries[n].size > head_len for n in read):
        return None
    if not 0 < head_len <= min(_MAX_PART, cd_off) or archive.file_size - cd_off > _MAX_PART:
        return None
    tail = archive.pread(archive.file_size - cd_off, cd_off)
    kept = _kept(tail, count, set(read))
    if kept is None:
        return None
    s = tree.storage
    moved = StorageRef(s.path, s.key, s.dtype, head_len, s.nbytes)
    head = archive.pread(head_len, 0)
    masked = b"".join([tail[a:b] for a, b in kept])
    return _Repeat(
        head, tail, kept, masked, TensorRef(moved, tree.storage_offset, tree.shape, tree.stride, tree.dtype)
    )


def _kept(tail: bytes, count: int, read: set[str]) -> tuple[tuple[int, int], ...] | None:
    """The spans of `tail` (directory, then end records) compared: all but the CRC-32 fields (bytes 16-20 of
    a directory record) of the members not in `read`."""
    kept: list[tuple[int, int]] = []
    p = at = 0
    for _ in range(count):
        if p + 46 > len(tail):
            return None
        nlen, xlen, clen = _CDIR.unpack_from(tail, p)
        name = tail[p + 46 : p + 46 + nlen].decode("utf-8", "replace")
        if name not in read:
            kept.append((at, p + 16))
            at = p + 20
        p += 46 + nlen + xlen + clen
    kept.append((at, len(tail)))
    return tuple(kept)
