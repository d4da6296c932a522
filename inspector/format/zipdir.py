"""A torch archive's central directory read in bulk: every record's fixed fields gathered by numpy at once,
for the stage-3 rank files of a big model (one record per parameter in each: ~1,100 for a 405B model, in
each of thousands of files), where the record-by-record loop costs about 1.3 µs a record.

The bulk read vouches only for the plain shape torch writes: records one after another from the directory's
first byte to its last, none with a zip64 field, stored, each inside the file. Anything else (a signature
inside a name, a size that needs zip64, a damaged field) returns None, and the caller's record-by-record
loop reads the directory again and refuses it in its own words: the bulk read never decides a refusal.
Its answer is the loop's, field for field (tests/format/test_zipdir.py).

The same archives' storages (a pickle replayed onto such a file asks for each placeholder's) are checked at
once too (`storages`): every local header read in one span (one read where the loop made one a page,
~40 for 1,100 placeholders: round trips on a parallel file system), the loop's checks in numpy, anything
unusual left to the loop.

numpy is imported only once the loop has read AFTER records in this process (or numpy is imported already,
as it is for convert and health): the import costs ~70 ms and ~13 MiB, the bulk read saves ~0.4 µs a
record, so a scan of a few hundred files would lose; AFTER is a quarter of a second of the loop's work.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Collection
from functools import partial
from itertools import repeat
from typing import Any, NamedTuple

from inspector.format.dtypes import ITEMSIZE
from inspector.format.views import StorageRef

BULK_RECORDS = 256  # directories (and storages asked of one archive) fewer than this: one by one
BULK_SPAN = 4 << 20  # the most bytes of local headers read at once for a bulk storage check
AFTER = 200_000  # records of big directories read by the loop before numpy is imported for the rest
_RECORD = 46  # a directory record's fixed part
_ZIP64 = [("id", "<u2"), ("len", "<u2"), ("usize", "<u8"), ("csize", "<u8"), ("hoff", "<u8")]  # torch's extra
_looped = 0  # records of big directories the loop read in this process


class ZipEntry(NamedTuple):
    """One archive member: where its local header is and how big it is (from the central directory). A
    named tuple: a save's thousands of rank files make tens of thousands, each made at a third of the cost
    of a frozen dataclass."""

    name: str
    header_offset: int
    size: int
    method: int
    crc: int  # CRC-32 of the member's bytes, from the central directory (torch's local headers carry 0)


_ENTRY = partial(tuple.__new__, ZipEntry)  # ZipEntry._make without its Python call


def wanted(count: int) -> bool:
    """Whether a directory of `count` records is read in bulk (see the module docstring)."""
    global _looped
    if count < BULK_RECORDS:
        return False
    if "numpy" in sys.modules:
        return True
    if _looped >= AFTER:
        return True
    _looped += count
    return False


def read(cd: bytes, count: int, cd_off: int, file_size: int) -> tuple[dict[str, ZipEntry], dict[str, int]] | None:
    """The `count` records of directory `cd` (which starts at `cd_off` of a file of `file_size` bytes) by
    name, in directory order, and where each must end (the next member's local header, or the directory);
    None where the plain shape does not hold and the record-by-record loop must judge."""
    import numpy as np

    a = np.frombuffer(cd, np.uint8)
    if a.shape[0] < _RECORD * count:
        return None
    # every `PK\x01\x02` in the directory; the records are exactly these when each one's lengths lead to
    # the next and the last to the directory's end (a name holding the signature breaks that chain)
    at = np.flatnonzero((a[:-3] == 0x50) & (a[1:-2] == 0x4B) & (a[2:-1] == 1) & (a[3:] == 2))
    if at.shape[0] != count or at[0] != 0 or int(at[-1]) + _RECORD > a.shape[0]:
        return None
    rec = a[at[:, None] + np.arange(_RECORD, dtype=at.dtype)].view(_dtype()).ravel()  # the fixed parts
    f = {k: rec[k].astype(np.int64) for k in rec.dtype.names}
    names_at, size, hoff = at + _RECORD, f["usize"], f["hoff"]
    after = names_at + f["nlen"] + f["xlen"] + f["clen"]
    if not (np.array_equal(after[:-1], at[1:]) and int(after[-1]) == a.shape[0]):
        return None
    big = 0xFFFFFFFF
    csize = f["csize"]
    wide = (csize == big) & (size == big) & (hoff == big)  # torch's zip64 form: all three in an extra (id 1)
    if wide.any():  # first, its values used; any other zip64 shape (and a damaged one) is the loop's
        found = _zip64(a, (names_at + f["nlen"])[wide], f["xlen"][wide], cd_off, file_size)
        if found is None:
            return None
        size, hoff, csize = size.copy(), hoff.copy(), csize.copy()
        size[wide] = csize[wide] = found[0]
        hoff[wide] = found[1]
    if (
        f["method"].any()
        or not np.array_equal(csize, size)
        or (~wide & ((f["csize"] == big) | (f["usize"] == big) | (f["hoff"] == big))).any()  # the loop's
        or (hoff + 30 > cd_off).any()
        or (size > file_size).any()
    ):
        return None
    spans = zip(names_at.tolist(), (names_at + f["nlen"]).tolist(), strict=True)
    try:
        names = [cd[s:e].decode("utf-8") for s, e in spans]
    except UnicodeDecodeError:
        return None
    # each member ends before the next one's local header (in file order; ties keep directory order)
    order = np.argsort(hoff, kind="stable")
    nexts = np.append(hoff[order][1:], cd_off)
    if (hoff[order] + 30 + f["nlen"][order] + size[order] > nexts).any():
        return None
    ends = np.empty(count, np.int64)
    ends[order] = nexts
    made = zip(names, hoff.tolist(), size.tolist(), repeat(0), f["crc"].tolist())  # method 0: stored
    entries = dict(zip(names, map(_ENTRY, made)))  # noqa: B905 (all count long)
    if len(entries) != count:  # a name twice: the loop refuses it (the dict is the set it was checked by)
        return None
    return entries, dict(zip(names, ends.tolist()))  # noqa: B905


def _zip64(a: Any, at: Any, xlen: Any, cd_off: int, file_size: int) -> tuple[Any, Any] | None:
    """(sizes, header offsets) from the zip64 extras at `at` (each record's, after its name), as the loop
    reads torch's: id 1 first, at least 24 bytes, its sizes equal (stored) and inside the file. None for
    anything else."""
    import numpy as np

    if (xlen < 28).any():
        return None
    x = a[at[:, None] + np.arange(28, dtype=at.dtype)].view(_ZIP64).ravel()
    usize, csize, hoff = x["usize"], x["csize"], x["hoff"]
    if (x["id"] != 1).any() or (x["len"] < 24).any() or not np.array_equal(usize, csize):
        return None
    if (usize > file_size).any() or (hoff >= cd_off).any():  # in uint64: nothing wraps
        return None
    return usize.astype(np.int64), hoff.astype(np.int64)


@functools.cache
def _dtype() -> Any:
    """A directory record's fixed part as numpy reads it: the fields the archive's reading needs (made once,
    not once a file)."""
    import numpy as np

    fields = {
        "method": ("<u2", 10),
        "crc": ("<u4", 16),
        "csize": ("<u4", 20),
        "usize": ("<u4", 24),
        "nlen": ("<u2", 28),
        "xlen": ("<u2", 30),
        "clen": ("<u2", 32),
        "hoff": ("<u4", 42),
    }
    return np.dtype(
        {
            "names": list(fields),
            "formats": [f for f, _ in fields.values()],
            "offsets": [o for _, o in fields.values()],
            "itemsize": _RECORD,
        }
    )


def storages(
    archive: Any, requests: list[tuple[str, str, int]], wanted: Collection[str] | None
) -> dict[str, StorageRef] | None:
    """`TorchZip.storages_for` of a big archive's storages checked at once (a stage-3 rank file's placeholders:
    one record each): their local headers read in one span, the checks `data_offsets`'. None where anything
    is unusual (a key asked twice, a record or dtype unknown, headers spread over more than BULK_SPAN), and
    for fewer than BULK_RECORDS or an archive asked before: the loop then checks them one by one, refusing
    in its words."""
    if not ready(len(requests)) or archive.storages():
        return None
    stem = archive.prefix + "data/"
    names = [stem + key for key, _, _ in requests]
    entries = list(map(archive.entries.get, names))
    sizes = [ITEMSIZE.get(dtype, 0) for _, dtype, _ in requests]  # 0: a dtype the loop refuses
    if None in entries or 0 in sizes or len(set(names)) != len(names):
        return None
    heads = [e.header_offset for e in entries]
    lo, hi = min(heads), max(heads) + 30
    if hi - lo > BULK_SPAN:
        return None
    needs = [numel * size for (_, _, numel), size in zip(requests, sizes, strict=True)]
    bounds = list(map(archive._bounds.__getitem__, names))
    starts = data_offsets(
        archive.pread(hi - lo, lo), lo, heads, [e.size for e in entries], bounds, needs, archive.file_size
    )
    if starts is None:
        return None
    path, base = archive.path, archive.base
    return {
        key: StorageRef(path, key, dtype, base + start, need)
        for (key, dtype, _), start, need in zip(requests, starts, needs, strict=True)
        if wanted is None or key in wanted
    }


def ready(count: int) -> bool:
    """Whether `count` storages of one archive are checked in bulk (`data_offsets`): as many as a big
    directory's records, and numpy already imported (never imported for this alone)."""
    return count >= BULK_RECORDS and "numpy" in sys.modules


def data_offsets(
    span: bytes,
    lo: int,
    headers: list[int],
    sizes: list[int],
    ends: list[int],
    needs: list[int],
    file_size: int,
) -> list[int] | None:
    """Where each storage's bytes start (after its local header), checked as `TorchZip.storage` checks one:
    a local header at each offset of `headers` (read in `span`, which starts at offset `lo` and holds every
    header's 30 fixed bytes), the bytes ending inside the file and before `ends` (the next member), the
    record holding `needs` bytes. None where any check fails: the caller's loop then says which, in its
    words."""
    import numpy as np

    a = np.frombuffer(span, np.uint8)
    at = np.asarray(headers, np.int64) - lo
    if at.shape[0] == 0 or int(at.min()) < 0 or int(at.max()) + 30 > a.shape[0]:
        return None
    head = a[at[:, None] + np.arange(30, dtype=np.int64)]  # each local header's fixed part
    if not (head[:, :4] == np.frombuffer(b"PK\x03\x04", np.uint8)).all():
        return None
    lengths = head[:, 26:30].astype(np.int64)
    start = at + lo + 30 + lengths[:, 0] + (lengths[:, 1] << 8) + lengths[:, 2] + (lengths[:, 3] << 8)
    size = np.asarray(sizes, np.int64)
    end = start + size
    if (
        (end > file_size).any()
        or (end > np.asarray(ends, np.int64)).any()
        or (np.asarray(needs) > size).any()
    ):
        return None
    return start.tolist()
