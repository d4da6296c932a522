"""A torch archive's central directory read in bulk: every record's fixed fields gathered by numpy at once,
for the stage-3 rank files of a big model (one record per parameter in each: ~1,100 for a 405B model, in
each of thousands of files), where the record-by-record loop costs about 1.3 µs a record.

The bulk read vouches only for the plain shape torch writes: records one after another from the directory's
first byte to its last, none with a zip64 field, stored, each inside the file. Anything else (a signature
inside a name, a size that needs zip64, a damaged field) returns None, and the caller's record-by-record
loop reads the directory again and refuses it in its own words: the bulk read never decides a refusal.
Its answer is the loop's, field for field (tests/format/test_zipdir.py).

numpy is imported only once a process has met `AFTER` such directories (a scan of a few files would pay
more for the import, ~60 ms, than the bulk read saves) or has imported numpy already.
"""

from __future__ import annotations

import sys
from typing import Any, NamedTuple

BULK_RECORDS = 256  # directories with fewer records are read record by record
AFTER = 3  # big directories read record by record before numpy is imported for the rest
_RECORD = 46  # a directory record's fixed part
_met = 0


class Columns(NamedTuple):
    """The records' fields in directory order."""

    names: list[str]
    offsets: list[int]  # each local header's
    sizes: list[int]
    crcs: list[int]
    ends: list[int]  # where each member must end: the next member's local header, or the directory


def wanted(count: int) -> bool:
    """Whether a directory of `count` records is read in bulk (see the module docstring)."""
    global _met
    if count < BULK_RECORDS:
        return False
    if "numpy" in sys.modules:
        return True
    _met += 1
    return _met > AFTER


def read(cd: bytes, count: int, cd_off: int, file_size: int) -> Columns | None:
    """The `count` records of directory `cd` (which starts at `cd_off` of a file of `file_size` bytes), or
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
    if (
        f["method"].any()
        or not np.array_equal(f["csize"], size)
        or (size == 0xFFFFFFFF).any()  # zip64's sizes and offsets: the loop reads those
        or (hoff == 0xFFFFFFFF).any()
        or (hoff + 30 > cd_off).any()
        or (size > file_size).any()
    ):
        return None
    spans = zip(names_at.tolist(), (names_at + f["nlen"]).tolist(), strict=True)
    try:
        names = [cd[s:e].decode("utf-8") for s, e in spans]
    except UnicodeDecodeError:
        return None
    if len(set(names)) != count:
        return None
    # each member ends before the next one's local header (in file order; ties keep directory order)
    order = np.argsort(hoff, kind="stable")
    nexts = np.append(hoff[order][1:], cd_off)
    if (hoff[order] + 30 + f["nlen"][order] + size[order] > nexts).any():
        return None
    ends = np.empty(count, np.int64)
    ends[order] = nexts
    return Columns(names, hoff.tolist(), size.tolist(), f["crc"].tolist(), ends.tolist())


def _dtype() -> Any:
    """A directory record's fixed part as numpy reads it: the fields the archive's reading needs."""
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
