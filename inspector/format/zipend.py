"""Where a torch zip archive's directory is: its end records, found from the file's tail.

A mixin of `TorchZip` (it reads through the archive's `pread`, keeps the tail it read as `_tail` for the
directory's read, and refuses through `damaged`): the search is its own concern, apart from the entries."""

from __future__ import annotations

import struct
from typing import TYPE_CHECKING

from inspector.errors import CorruptFileError

_EOCD = b"PK\x05\x06"
_EOCD64 = b"PK\x06\x06"
_EOCD64_LOC = b"PK\x06\x07"


class EndRecords:
    """The end records' search; `TorchZip` provides `pread`, `file_size`, `_tail` and `damaged`."""

    file_size: int
    _tail: tuple[int, bytes]

    if TYPE_CHECKING:  # TorchZip's (a stub here would come first in its MRO and hide Container's pread)

        def pread(self, n: int, offset: int) -> bytes: ...

        def damaged(self, why: str) -> CorruptFileError: ...

    def _end_record(self) -> tuple[int, int, int]:
        """(entry count, directory size, directory offset) from the real end record: of
        the `PK\\x05\\x06` signatures whose comment length reaches exactly the end of the file (a comment can
        hold a whole fake record), the last that describes a non-empty directory before it; then its zip64
        record when the locator before it points at one."""
        for tail_len in (min(self.file_size, 4096), min(self.file_size, 65536 + 22)):
            found = self._end_in_tail(tail_len)
            if found is not None:
                return found
        raise self.damaged("no usable zip end-of-directory record")

    def _end_in_tail(self, tail_len: int) -> tuple[int, int, int] | None:
        """The last usable end record in the file's last `tail_len` bytes: a short tail first, since torch
        writes no comment (the answer is the same: the search runs from the end)."""
        tail = self.pread(tail_len, self.file_size - tail_len)
        self._tail = (self.file_size - tail_len, tail)  # the end records and directory are read from it
        pos = tail.rfind(_EOCD)
        while pos >= 0:
            if len(tail) - pos >= 22:
                (clen,) = struct.unpack("<H", tail[pos + 20 : pos + 22])
                if pos + 22 + clen == len(tail):
                    found = self._directory_at(tail, pos, self.file_size - tail_len + pos)
                    if found is not None:
                        return found[:3]
            pos = tail.rfind(_EOCD, 0, pos)
        return None

    def end_directory(self) -> tuple[int, int, int, int] | None:
        """(entry count, directory size, directory offset, end records' offset) when the archive's last 22
        bytes are an end record without a comment that describes a directory: the record `_end_record`
        tries first and so the one it took; None otherwise. Offsets are the archive's (its window's)."""
        if self.file_size < 22:
            return None
        tail = self.pread(22, self.file_size - 22)
        if tail[:4] != _EOCD or tail[20:22] != b"\0\0":
            return None
        return self._directory_at(tail, 0, self.file_size - 22)

    def _directory_at(self, tail: bytes, pos: int, eocd_off: int) -> tuple[int, int, int, int] | None:
        (_, _, _, count, cd_size, cd_off, _) = struct.unpack("<4H2LH", tail[pos + 4 : pos + 22])
        if eocd_off >= 20:
            loc = self.pread(20, eocd_off - 20)
            if loc[:4] == _EOCD64_LOC:
                (eocd64_off,) = struct.unpack("<Q", loc[8:16])
                if eocd64_off + 56 > eocd_off - 20:
                    raise self.damaged("the zip64 end record lies past its locator")
                rec = self.pread(56, eocd64_off)
                if rec[:4] != _EOCD64:
                    raise self.damaged("bad zip64 end-of-directory record")
                count, cd_size, cd_off = struct.unpack("<QQQ", rec[32:56])
                eocd_off = eocd64_off
        if count == 0 or cd_off + cd_size > eocd_off:
            return None
        return count, cd_size, cd_off, eocd_off
