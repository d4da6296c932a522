"""The zip container of a `torch.save` file, parsed from its central directory (zip64 included) by offset."""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass

from inspector.errors import CorruptFileError, UnsupportedCheckpointError
from inspector.system.source import Source, open_in, os_error

_EOCD = b"PK\x05\x06"
_EOCD64 = b"PK\x06\x06"
_EOCD64_LOC = b"PK\x06\x07"
_CDIR = b"PK\x01\x02"
_LOCAL = b"PK\x03\x04"


@dataclass(frozen=True, slots=True)
class ZipEntry:
    """One archive member: where its local header is and how big it is (from the central directory)."""

    name: str
    header_offset: int
    size: int
    method: int


class TorchZip:
    """A `torch.save` archive opened read-only through the confined source; entries are located, never extracted."""

    def __init__(self, path: str | os.PathLike[str], source: Source | None = None) -> None:
        self.path = os.fspath(path)
        self.fd = open_in(self.path, (source,) if source else ())
        try:
            self.file_size = os.fstat(self.fd).st_size
            self.entries = self._read_directory()
        except OSError as exc:
            os.close(self.fd)
            raise os_error(self.path, exc) from None
        except BaseException:
            os.close(self.fd)
            raise
        self.prefix = self._find_prefix()
        self._data_offsets: dict[str, int] = {}

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __enter__(self) -> TorchZip:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def pread(self, n: int, offset: int) -> bytes:
        try:
            data = os.pread(self.fd, n, offset)
        except OSError as exc:
            raise os_error(self.path, exc) from None
        if len(data) != n:
            raise self._truncated(f"wanted {n} bytes at offset {offset}")
        return data

    def _truncated(self, why: str) -> CorruptFileError:
        return CorruptFileError(
            f"{self.path}: the file is truncated or damaged ({why}; file size {self.file_size} bytes).",
            hint="It was probably cut off while saving or copying; copy it again from the source.",
        )

    def _read_directory(self) -> dict[str, ZipEntry]:
        if self.file_size == 0:
            raise CorruptFileError(
                f"{self.path}: the file is empty (0 bytes).",
                hint="It was probably cut off while saving or copying; copy it again.",
            )
        head = os.pread(self.fd, 4, 0)
        if head != _LOCAL:
            if head[:1] == b"\x80":
                raise UnsupportedCheckpointError(
                    f"{self.path}: legacy (non-zip) torch.save format.",
                    hint="It was saved with checkpoint_serialization=false or torch<1.6; re-save it with "
                    "torch.save's default zip format, or load it with torch.load in a trusted environment.",
                )
            raise CorruptFileError(
                f"{self.path}: not a torch.save archive (starts with {head!r}).",
                hint="Only DeepSpeed/torch .pt files can be read here.",
            )
        tail_len = min(self.file_size, 65536 + 22)
        tail = os.pread(self.fd, tail_len, self.file_size - tail_len)
        pos = tail.rfind(_EOCD)
        if pos < 0 or len(tail) - pos < 22:
            raise self._truncated("no zip end-of-directory record")
        eocd_off = self.file_size - tail_len + pos
        (_, _, _, count, cd_size, cd_off, _) = struct.unpack("<4H2LH", tail[pos + 4 : pos + 22])
        if eocd_off >= 20:
            loc = os.pread(self.fd, 20, eocd_off - 20)
            if loc[:4] == _EOCD64_LOC:
                (eocd64_off,) = struct.unpack("<Q", loc[8:16])
                rec = self.pread(56, eocd64_off)
                if rec[:4] != _EOCD64:
                    raise self._truncated("bad zip64 end-of-directory record")
                count, cd_size, cd_off = struct.unpack("<QQQ", rec[32:56])
        if cd_off + cd_size > self.file_size:
            raise self._truncated("central directory past end of file")
        cd = self.pread(cd_size, cd_off)
        entries: dict[str, ZipEntry] = {}
        p = 0
        for _ in range(count):
            if cd[p : p + 4] != _CDIR:
                raise self._truncated("bad central directory entry")
            (method, csize, usize, nlen, xlen, clen, hoff) = struct.unpack(
                "<H8xLLHHH8xL", cd[p + 10 : p + 46]
            )
            name = cd[p + 46 : p + 46 + nlen].decode("utf-8", "replace")
            extra = cd[p + 46 + nlen : p + 46 + nlen + xlen]
            if 0xFFFFFFFF in (csize, usize, hoff):
                usize, csize, hoff = _zip64_extra(extra, usize, csize, hoff)
            if method != 0 or csize != usize:
                raise CorruptFileError(
                    f"{self.path}: entry {name} is compressed (method {method}).",
                    hint="torch.save never compresses; the file was re-zipped. "
                    "Re-save it with torch.save or re-zip with `zip -0`.",
                )
            entries[name] = ZipEntry(name, hoff, usize, method)
            p += 46 + nlen + xlen + clen
        self._bounds = self._entry_bounds(entries, cd_off)
        return entries

    def _entry_bounds(self, entries: dict[str, ZipEntry], cd_off: int) -> dict[str, int]:
        """Where each entry must end: the next entry's local header (or the central directory).

        `torch.save` writes members one after another, so two records sharing bytes, or a record running
        into the directory, can only come from a damaged or crafted file: such a file is refused."""
        order = sorted(entries.values(), key=lambda e: e.header_offset)
        bounds: dict[str, int] = {}
        for e, nxt in zip(order, [*order[1:], None], strict=True):
            end = nxt.header_offset if nxt is not None else cd_off
            if e.header_offset + 30 + len(e.name.encode()) + e.size > end:
                raise self._truncated(f"record {e.name} overlaps the next member of the archive")
            bounds[e.name] = end
        return bounds

    def _find_prefix(self) -> str:
        for name in self.entries:
            if name.endswith("data.pkl") and name.count("/") <= 1:
                return name[: -len("data.pkl")]
        raise CorruptFileError(f"{self.path}: no data.pkl in the archive; not a torch.save file.")

    def data_offset(self, name: str) -> int:
        """Absolute file offset of an entry's bytes: local header + its own name/extra lengths."""
        off = self._data_offsets.get(name)
        if off is None:
            e = self.entries[name]
            hdr = self.pread(30, e.header_offset)
            if hdr[:4] != _LOCAL:
                raise self._truncated(f"bad local header for {name}")
            nlen, xlen = struct.unpack("<HH", hdr[26:30])
            off = e.header_offset + 30 + nlen + xlen
            if off + e.size > self.file_size:
                raise self._truncated(f"record {name} ends at byte {off + e.size}")
            if off + e.size > self._bounds[name]:
                raise self._truncated(f"record {name} overlaps the next member of the archive")
            self._data_offsets[name] = off
        return off

    def read_entry(self, name: str) -> bytes:
        return self.pread(self.entries[name].size, self.data_offset(name))

    def record(self, key: str) -> tuple[int, int]:
        """(absolute offset, size) of storage record `data/<key>`."""
        name = f"{self.prefix}data/{key}"
        if name not in self.entries:
            raise CorruptFileError(
                f"{self.path}: the pickle refers to storage {key!r}, which is not in the archive.",
                hint="The file is damaged; copy it again from the source.",
            )
        return self.data_offset(name), self.entries[name].size

    def byteorder(self) -> str:
        name = f"{self.prefix}byteorder"
        return self.read_entry(name).decode().strip() if name in self.entries else "little"


def _zip64_extra(extra: bytes, usize: int, csize: int, hoff: int) -> tuple[int, int, int]:
    p = 0
    while p + 4 <= len(extra):
        hid, hlen = struct.unpack("<HH", extra[p : p + 4])
        if hid == 1:
            vals = list(struct.unpack(f"<{hlen // 8}Q", extra[p + 4 : p + 4 + (hlen // 8) * 8]))
            if usize == 0xFFFFFFFF:
                usize = vals.pop(0)
            if csize == 0xFFFFFFFF:
                csize = vals.pop(0)
            if hoff == 0xFFFFFFFF:
                hoff = vals.pop(0)
            break
        p += 4 + hlen
    return usize, csize, hoff
