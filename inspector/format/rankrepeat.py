"""A rank file that repeats an earlier rank's archive but for its name: its directory not parsed again.

The ranks of a save write the same archive under their own names: `torch.save` puts every member under the
file's stem (`zero_pp_rank_7_mp_rank_00_model_states/data/12`), and a stage-3 model-states file holds the
same placeholders, buffers and pickle on every rank. On the real DeepSpeed saves committed as fixtures, the
model-states files of ranks 1.. are byte-identical once that prefix is taken out; a frozen parameter's
fragment (its bytes, its CRC-32) or an optimizer partition is what differs. Yet each was read as if new:
at 1,273 records (a 405B model's ~1,140) a file's directory cost 0.95 ms and its storages' checks 0.85 ms.

What the zip reader decides about an archive's directory (the entries, where each must end, the prefix) is
a function of the directory's bytes with each name's prefix taken out, provided that prefix is one folder
(it ends with its only "/", as `_find_prefix` requires), and of the file's length; a storage's verdict and
where its bytes start are a function of its local header's signature and lengths and of the directory's
answer. So an archive whose directory and end records equal a learnt one's, but for the prefix at each name
and the CRC-32 fields of records that hold bytes (which no check reads: only `data.pkl` and `byteorder`
are read whole, and they hold the same bytes on every rank or the match fails), is given that archive's
entries and bounds, under the learnt names (the prefix is internal: every lookup is `prefix + name`), with
its own CRC-32s read from its own directory where a record is read whole. Its storages, asked by the same
replayed pickle, get the learnt verdicts where their local headers equal the learnt ones but for the prefix:
headers that lie close together as one span (the records' bytes between them masked), each one far from
the others (an optimizer file's partitions, megabytes apart) as a span of its own, one read each. Anything
else (another length, another layout, damage anywhere compared) is read in full and refused there in its
own words.
"""

from __future__ import annotations

import bisect
import struct
import threading
from dataclasses import dataclass
from itertools import pairwise
from typing import Any

from inspector.errors import InspectorError
from inspector.format.views import StorageRef
from inspector.format.zipdir import _RECORD  # a directory record's fixed part; its name follows

_LENGTHS = struct.Struct("<28xHHH")  # a directory record's name, extra and comment lengths
_LOCAL_LENGTHS = struct.Struct("<HH")  # a local header's name and extra lengths, at its byte 26
_HEADER_ROOM = 4096  # bytes read past the last local header's fixed part for its name and extra
_ZERO = b"\0\0\0\0"
_MAX_LAYOUTS = 8  # a save's rank files come in a few shapes (rank digits, model or optimizer states)
_MAX_SPAN = 1 << 20  # bytes of local headers compared in all, at most (1,273 placeholders: ~190 KiB)
_MAX_MASKED = 64 << 10  # record bytes inside the spans left out of the comparison, at most
_JOIN = 4096  # a header this close after the last one's start joins its span (a read skipped; the
# record bytes read past it, at most this, cost less than one)
_MAX_SPANS = 64  # reads a repeat's storages take at most (an optimizer file has a few per group)
_MAX_KEPT = 4 << 20  # bytes of directories and spans kept in all layouts
_WHOLE_MAX = 4 << 20  # a file read whole by its first read (`whole`) is at most this big


@dataclass(frozen=True, slots=True)
class _Span:
    """Local headers read at once, [lo, lo + size), as the learnt archive held them."""

    lo: int
    size: int
    pieces: tuple[bytes, ...]  # the learnt bytes, records' bytes zeroed (`masked`), cut at each header's prefix
    masked: tuple[tuple[int, int], ...]  # [start, end) in the span: a record's bytes and what follows it

    def repeated(self, archive: Any, prefix: bytes) -> bool:
        """Whether `archive` holds these headers here, under its own `prefix`."""
        at, page = archive.page(self.lo, self.size)  # kept: the step counters and probe after it read there
        held = memoryview(page)[self.lo - at : self.lo - at + self.size]
        if len(held) != self.size:  # the file ends inside the span
            return False
        want = bytearray(prefix).join(self.pieces)
        for a, b in self.masked:  # the records' own bytes, which no check reads, taken as they are
            want[a:b] = held[a:b]
        return want == held  # one buffer made, compared where it lies


@dataclass(frozen=True, slots=True)
class _Storages:
    """The storages one replayed pickle asked of the learnt archive: its verdicts and what proved them."""

    requests: Any  # the replay's request list and wanted keys (`replay.Template`): the same objects again
    wanted: Any
    made: tuple[tuple[str, str, int, int], ...]  # (key, dtype, data offset, bytes) of each StorageRef made
    spans: tuple[_Span, ...]  # every requested record's local header in one of them, in file order

    @property
    def size(self) -> int:
        return sum(s.size for s in self.spans)


@dataclass(frozen=True, slots=True)
class Layout:
    """What an archive's directory said, and the bytes that said it."""

    prefix: str
    raw_prefix: bytes
    entries: dict[str, Any]  # the learnt archive's, shared (never changed after it is read)
    bounds: dict[str, int]
    size: int  # bytes of the directory and end records
    pieces: tuple[bytes, ...]  # them, CRC-32 fields at `crcs` zeroed, cut at each name's prefix
    crcs: tuple[int, ...]  # offsets of the CRC-32 fields of records holding bytes
    crc_of: dict[str, int]  # entry name -> offset of its CRC-32 field, for those records
    storages: _Storages | None
    reads: int  # bytes of the file a repeat reads: its directory and end records, its pickle, its spans


_LAYOUTS: dict[tuple[int, int, int, int], Layout] = {}
_LOCK = threading.Lock()  # a bucket's rank files load on several threads: one changes the layouts at a time


def known(key: tuple[int, int, int, int]) -> bool:
    """Whether a layout was learnt for a directory found at `key` (file size, directory offset and size,
    records): only then is the directory read with its end records, to be compared."""
    return key in _LAYOUTS


def whole(file_size: int) -> bool:
    """Whether a rank file of `file_size` bytes is best read whole by its first read: a learnt archive of that
    size is mostly what a repeat of it reads (a stage-3 model-states file of ~1,270 placeholders: directory,
    pickle and local headers, 0.5 MB of 0.52), so one read replaces five (from a bucket, five requests)."""
    if file_size > _WHOLE_MAX:
        return False
    return any(k[0] == file_size and 2 * lay.reads >= file_size for k, lay in list(_LAYOUTS.items()))


def adopt(archive: Any, tail: memoryview, key: tuple[int, int, int, int]) -> tuple[Layout, str] | None:
    """(the learnt layout `tail` repeats, the prefix this archive's own names have), if one does: `tail` is
    this archive's directory and end records, found at `key` (file size, directory offset, directory size,
    records); the caller then takes the layout's entries, bounds and prefix."""
    lay = _LAYOUTS.get(key)
    if lay is None or archive.base or len(tail) != lay.size:
        return None
    own = bytes(tail[_RECORD : _RECORD + len(lay.raw_prefix)])
    if not _one_folder(own, len(lay.raw_prefix)):
        return None
    # the learnt bytes with this prefix at each name, exactly where the learnt one stood, and this file's own
    # CRC-32s of records holding bytes (no check reads them: a record read whole checks its own)
    want = bytearray(own).join(lay.pieces)
    for at in lay.crcs:
        want[at : at + 4] = tail[at : at + 4]
    return (lay, own.decode("utf-8")) if want == tail else None


def _one_folder(raw: bytes, n: int) -> bool:
    """A prefix `_find_prefix` takes the same way as the learnt one: `n` bytes of UTF-8 ending with their
    only "/"."""
    if len(raw) != n or not raw.endswith(b"/") or raw.count(b"/") != 1:
        return False
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def storages(archive: Any, lay: Layout, requests: Any, wanted: Any) -> dict[str, StorageRef] | None:
    """The learnt storages' refs in `archive` (its own path), where the same replay asks for them and its
    local headers are the learnt ones but for the prefix; None otherwise (the caller checks them)."""
    st = lay.storages
    if st is None or requests is not st.requests or wanted is not st.wanted:
        return None
    prefix = archive.own_prefix.encode("utf-8")
    if not all(span.repeated(archive, prefix) for span in st.spans):
        return None
    path, base = archive.path, archive.base
    if not base:  # the learnt offsets' own int objects, not equal new ones: 8 fewer per optimizer file
        return {k: StorageRef(path, k, dtype, off, need) for k, dtype, off, need in st.made}
    return {k: StorageRef(path, k, dtype, base + off, need) for k, dtype, off, need in st.made}


def learn(archive: Any, requests: Any, wanted: Any, refs: dict[str, StorageRef]) -> None:
    """Keep the layout of `archive`, read in full and its storages checked by a replay (`requests`,
    `wanted`: the replay's, `refs`: the StorageRefs made), where its directory is torch's plain one: the
    last 22 bytes its end record, every name under one prefix folder. What a later file is compared with:
    these bytes cut at each name's prefix, which its own prefix joins again (positions, never a search)."""
    try:
        _learn(archive, requests, wanted, refs)
    except InspectorError:  # the file changed under the read: nothing learnt, the archive stands as read
        return


def _learn(archive: Any, requests: Any, wanted: Any, refs: dict[str, StorageRef]) -> None:
    end = archive.end_directory()
    if end is None or archive.base or archive.own_prefix != archive.prefix:
        return
    count, cd_size, cd_off, _ = end
    key = (archive.file_size, cd_off, cd_size, count)
    if key in _LAYOUTS and not archive._relearn:  # learnt; or this one differed from it: the newer kept
        return
    raw_prefix = archive.prefix.encode("utf-8")
    tail = archive.pread(archive.file_size - cd_off, cd_off)
    found = _records(tail, count, archive) if _one_folder(raw_prefix, len(raw_prefix)) else None
    if found is None:
        return
    crc_of, names = found
    directory = bytearray(tail)
    for at in crc_of.values():
        directory[at : at + 4] = _ZERO
    spans = _storages(archive, requests, wanted, refs, raw_prefix)
    pkl = archive.entries.get(archive.prefix + "data.pkl")
    lay = Layout(
        archive.prefix,
        raw_prefix,
        archive.entries,
        archive._bounds,
        len(tail),
        _cut(bytes(directory), names, len(raw_prefix)),
        tuple(crc_of.values()),
        crc_of,
        spans,
        len(tail) + (pkl.size if pkl else 0) + (spans.size if spans else 0),
    )
    with _LOCK:
        _LAYOUTS.pop(key, None)
        while _LAYOUTS and (len(_LAYOUTS) >= _MAX_LAYOUTS or _kept() + _size(lay) > _MAX_KEPT):
            _LAYOUTS.pop(next(iter(_LAYOUTS)))  # the oldest forgotten first
        if _size(lay) <= _MAX_KEPT and len(_LAYOUTS) < _MAX_LAYOUTS:
            _LAYOUTS[key] = lay


def _size(lay: Layout) -> int:
    return lay.size + (lay.storages.size if lay.storages else 0)


def _cut(raw: bytes, at: list[int], n: int) -> tuple[bytes, ...]:
    """`raw` without the `n` bytes at each offset of `at` (ascending): the pieces a prefix joins again."""
    ends = [0, *(a + n for a in at)]
    return tuple(raw[a:b] for a, b in zip(ends, [*at, len(raw)], strict=True))


def _kept() -> int:
    return sum(map(_size, _LAYOUTS.values()))


def _records(tail: bytes, count: int, archive: Any) -> tuple[dict[str, int], list[int]] | None:
    """(entry name -> offset in `tail` of its CRC-32 field, for each record holding bytes other than those
    read whole: `data.pkl`, `byteorder`, whose CRC-32 must match; the offset of each name), each name under
    the archive's prefix; None where the records do not lead from one to the next as the reader found them."""
    crcs: dict[str, int] = {}
    names: list[int] = []
    whole = {archive.prefix + "data.pkl", archive.prefix + "byteorder"}
    raw_prefix = archive.prefix.encode("utf-8")
    p = 0
    for _ in range(count):
        if p + _RECORD > len(tail):
            return None
        nlen, xlen, clen = _LENGTHS.unpack_from(tail, p)
        raw = tail[p + _RECORD : p + _RECORD + nlen]
        entry = archive.entries.get(raw.decode("utf-8", "replace"))
        if entry is None or not raw.startswith(raw_prefix):
            return None
        if entry.size and entry.name not in whole:
            crcs[entry.name] = p + 16
        names.append(p + _RECORD)
        p += _RECORD + nlen + xlen + clen
    return crcs, names


def _storages(archive: Any, requests: Any, wanted: Any, refs: dict[str, StorageRef], raw: bytes) -> _Storages | None:
    """What proved the storages' verdicts: their local headers, those within _JOIN of each other read as one
    span (each record's bytes in it masked up to the next member's header), cut at each header's name; None
    where the spans, their reads or their masked bytes are too many to compare, or a header's name is not
    under the prefix."""
    stem, entries = archive.prefix + "data/", archive.entries
    try:
        heads = sorted({entries[stem + k].header_offset for k, _, _ in requests})
    except (KeyError, TypeError, ValueError):
        return None
    groups: list[list[int]] = []
    for h in heads:
        if groups and h - groups[-1][-1] <= _JOIN:
            groups[-1].append(h)
        else:
            groups.append([h])
    if not groups or len(groups) > _MAX_SPANS:
        return None
    starts = sorted((e.header_offset, name) for name, e in entries.items())
    spans: list[_Span] = []
    budget = [_MAX_SPAN, _MAX_MASKED]  # bytes compared, record bytes masked: what is left of each
    for g in groups:
        span = _span(archive, g[0], g[-1], raw, starts, budget)
        if span is None:
            return None
        spans.append(span)
    made = tuple((k, r.dtype, r.offset - archive.base, r.nbytes) for k, r in refs.items())
    return _Storages(requests, wanted, made, tuple(spans))


def _span(
    archive: Any, lo: int, last: int, raw: bytes, starts: list[tuple[int, str]], budget: list[int]
) -> _Span | None:
    """The span from the local header at `lo` to the end of the one at `last`, every member's header in it
    under the prefix `raw` (`starts`: each member's header offset and name, ascending); None past `budget`
    (bytes compared, bytes masked: spent here)."""
    if last + 30 - lo > budget[0]:
        return None
    span = bytearray(archive.pread(min(archive.file_size, last + 30 + _HEADER_ROOM) - lo, lo))
    if last - lo + 30 > len(span):
        return None
    hi = last + 30 + sum(_LOCAL_LENGTHS.unpack_from(span, last - lo + 26)) - lo  # the last header's end
    if hi > len(span) or hi > budget[0]:
        return None
    del span[hi:]
    masked: list[tuple[int, int]] = []
    names: list[int] = []  # where each local header's name starts: under the prefix, as in the directory
    for start, name in starts[bisect.bisect_left(starts, (lo,)) : bisect.bisect_left(starts, (lo + hi,))]:
        at = start - lo
        if at + 30 + len(raw) > hi:
            return None
        names.append(at + 30)
        if archive.entries[name].size:
            a = at + 30 + sum(_LOCAL_LENGTHS.unpack_from(span, at + 26))
            b = min(archive._bounds[name] - lo, hi)
            if a < b:
                masked.append((a, b))
    spent = sum(b - a for a, b in masked)
    if spent > budget[1] or any(b - a < len(raw) for a, b in pairwise(names)):
        return None
    budget[0] -= hi
    budget[1] -= spent
    for a, b in masked:
        span[a:b] = bytes(b - a)
    if any(span[a : a + len(raw)] != raw for a in names):
        return None
    return _Span(lo, hi, _cut(bytes(span), names, len(raw)), tuple(masked))
