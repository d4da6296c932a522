"""The zip container of a `torch.save` file, parsed from its central directory (zip64 included) by offset."""

from __future__ import annotations

import os
import struct
import zlib
from collections.abc import Callable, Collection, Iterable
from operator import itemgetter, methodcaller
from typing import Any

from inspector.errors import CorruptFileError, UnsupportedCheckpointError
from inspector.format import rankrepeat, zipdir
from inspector.format.container import Container, Window
from inspector.format.dtypes import ITEMSIZE, itemsize
from inspector.format.rankrepeat import Layout
from inspector.format.views import StorageRef
from inspector.format.zip64 import zip64_extra
from inspector.format.zipdir import ZipEntry
from inspector.format.zipend import EndRecords
from inspector.system.bytesource import ByteSource, Handle, open_handle_in
from inspector.text import shown

_LOCAL = b"PK\x03\x04"
_HEADER_PAGE = 4096  # bytes read at a time for local headers (one page: a read costs the same either way)
_PAGES_KEPT = 8  # header pages kept besides the head and tail (an optimizer file's records lie far apart)
_KEPT_BYTES = 256 << 10  # and no more bytes than this in them, the newest page whatever its size
_CDIR_RECORD = struct.Struct("<L6xH4xLLLHHH8xL")  # a directory record's fixed part: signature .. header offset
_LOCAL_LENGTHS = struct.Struct("<HH")  # a local header's name and extra lengths, at its byte 26
_ZIP64_ALL = struct.Struct("<HHQQQ")  # a zip64 extra (id 1) first, with all three sizes: what torch writes
_FIRST = itemgetter(0)
_MAX_DIRECTORY = 64 << 20  # a torch archive's directory is ~100 bytes per storage: 64 MiB is ~600k storages


class TorchZip(EndRecords, Container):
    """A `torch.save` archive opened read-only through the confined source (a folder or a bucket prefix);
    entries are located, never extracted."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        source: ByteSource | None = None,
        handle: Handle | None = None,
        window: tuple[int, int] | None = None,
        head: bytes = b"",
    ) -> None:
        """`handle`: the file already open (`torchzip.load` sniffs it first; `head`: the page it read there,
        not read again). `window`: (base, length) of an archive embedded in a bigger file (a DCP item), every
        offset relative to `base`, nothing outside read; `data_offset` answers in the file."""
        self.path = os.fspath(path)
        self.handle: Any = handle if handle is not None else open_handle_in(self.path, (source,) if source else ())
        self.base = 0
        if window is not None:
            self.handle = Window(self.handle, *window, self.shown)
            self.base = window[0]
        self.file_size = self.handle.size
        # bytes already read, served again by `pread`: the pages read at local headers (each with the start
        # of its record), newest first, the file's head (where data.pkl lies) and its tail (its end records,
        # often its directory) always among them
        self._page: tuple[int, bytes] = (0, head if window is None else b"")
        self._tail: tuple[int, bytes] = (0, b"")
        self._pages: list[tuple[int, bytes]] = []
        self._layout: Layout | None = None  # an earlier rank's archive this one repeats (`rankrepeat`), and
        self._own_tail, self._relearn = memoryview(b""), False  # then its own directory, end records (CRC-32s)
        self.own_prefix = ""  # the prefix its own names have: another than `prefix` where it repeats one
        try:
            self.entries = self._read_directory()
            self.prefix = self._layout.prefix if self._layout else self._find_prefix()
            self.own_prefix = self.own_prefix or self.prefix
        except BaseException:
            self.handle.close()
            raise
        self._data_offsets: dict[str, int] = {}
        self._storages: dict[str, StorageRef] = {}

    def pread(self, n: int, offset: int) -> bytes:
        """`n` bytes at `offset`: from a page already read when they lie inside one (a rank file's end records,
        directory, pickle, small records, big ones' first bytes), else from the file: a handful of calls."""
        if (found := self._kept(offset, n)) is not None:
            return found[1][offset - found[0] : offset - found[0] + n]
        return super().pread(n, offset)

    def page(self, at: int, n: int) -> tuple[int, bytes]:
        """(offset, bytes) of a page holding the `n` bytes at `at`: one kept, else `n` and two header pages
        read there (short at the file's end) and kept: the records' first bytes come with their headers."""
        found = self._kept(at, n)
        if found is None:
            found = (at, self.handle.pread(max(0, min(2 * _HEADER_PAGE + n, self.file_size - at)), at))
            self._keep(*found)
        return found

    def _keep(self, at: int, page: bytes) -> None:
        """`page`, read at `at`, kept as the newest; the oldest forgotten past _PAGES_KEPT pages or
        _KEPT_BYTES (a whole record read for its caller, a pickle of megabytes, is kept only while newest)."""
        pages = self._pages
        pages.insert(0, (at, page))
        total = 0
        for k, (_, buf) in enumerate(pages):
            total += len(buf)
            if k and (k >= _PAGES_KEPT or total > _KEPT_BYTES):
                del pages[k:]
                break

    def _kept(self, offset: int, n: int) -> tuple[int, bytes] | None:
        """The page already read that holds `n` bytes at `offset`, if one does."""
        for at, buf in (*self._pages, self._page, self._tail):
            if at <= offset and offset + n <= at + len(buf):
                return at, buf
        return None

    def damaged(self, why: str) -> CorruptFileError:
        return CorruptFileError(
            f"{self.shown}: the file is truncated or damaged ({why}; file size {self.file_size} bytes).",
            hint="It was probably cut off while saving or copying; copy it again from the source.",
        )

    def _read_directory(self) -> dict[str, ZipEntry]:
        self._check_head()
        count, cd_size, cd_off = self._end_record()
        # a real directory entry is 46 bytes plus a name and extras; bound the read by what `count` entries
        # can need and by the file, so a crafted size cannot make us read the whole rank file into memory
        if cd_size > _MAX_DIRECTORY:
            raise UnsupportedCheckpointError(
                f"{self.shown}: its zip directory is {cd_size:,} bytes ({count:,} records), above the "
                f"{_MAX_DIRECTORY >> 20} MiB this tool reads (about 600,000 tensors in one file).",
                hint="A checkpoint this fragmented is not read here; save its small tensors in fewer records.",
                title="Too many records",
            )
        if count > cd_size // 46 or cd_size > count * (46 + 3 * 0xFFFF):
            raise self.damaged("the central directory's size and entry count disagree")
        key = (self.file_size, cd_off, cd_size, count)
        if self.base == 0 and rankrepeat.known(key):  # the directory with the end records after it, compared
            kept = self._kept(cd_off, n := self.file_size - cd_off)  # seen where a page holds it (not copied)
            tail = memoryview(kept[1])[cd_off - kept[0] :][:n] if kept else memoryview(self.pread(n, cd_off))
            if (found := rankrepeat.adopt(self, tail, key)) is not None:  # another rank's archive: its answer
                lay, self.own_prefix = found
                self._layout, self._own_tail, self._bounds = lay, tail, lay.bounds
                return lay.entries
            self._relearn = True  # another archive of that shape: learnt from in its place, once read
            cd = bytes(tail[:cd_size])
        else:
            cd = self.pread(cd_size, cd_off)
        return self._entries(cd, count, cd_off)

    def _check_head(self) -> None:
        """A torch zip archive, by its first bytes: an empty file, a legacy torch.save or anything else is
        refused, each in its own words."""
        if self.file_size == 0:
            raise CorruptFileError(
                f"{self.shown}: the file is empty (0 bytes).",
                hint="It was probably cut off while saving or copying; copy it again.",
            )
        head = self._page[1] or self.handle.pread(min(_HEADER_PAGE, self.file_size), 0)
        self._page = (0, head)  # kept: data.pkl's header lies there
        if head[:4] != _LOCAL:
            if head[:1] == b"\x80":
                raise UnsupportedCheckpointError(
                    f"{self.shown}: legacy (non-zip) torch.save format.",
                    hint="It was saved with checkpoint_serialization=false or torch<1.6; re-save it with "
                    "torch.save's default zip format, or load it with torch.load in a trusted environment.",
                )
            raise CorruptFileError(
                f"{self.shown}: not a torch.save archive (it does not start like a zip file).",
                hint="Only DeepSpeed/torch .pt files can be read here.",
            )

    def _entries(self, cd: bytes, count: int, cd_off: int) -> dict[str, ZipEntry]:
        """The central directory's `count` records, each checked against the file: stored, unique, inside.
        One unpack per record from the directory read once (a rank file has dozens; a save, thousands), or
        all at once where a save's big directories are read in bulk (`zipdir`: the same answer)."""
        if zipdir.wanted(count) and (bulk := zipdir.read(cd, count, cd_off, self.file_size)) is not None:
            self._bounds = bulk[1]
            return bulk[0]
        entries: dict[str, ZipEntry] = {}
        spans: list[tuple[int, int, str]] = []  # (local header offset, name length + size, name)
        unpack, zip64, new, size = _CDIR_RECORD.unpack_from, _ZIP64_ALL.unpack_from, tuple.__new__, self.file_size
        p, end = 0, len(cd)
        for _ in range(count):
            if p + 46 > end:
                raise self.damaged("bad central directory entry")
            (sig, method, crc, csize, usize, nlen, xlen, clen, hoff) = unpack(cd, p)
            if sig != 0x02014B50:  # `PK\x01\x02`
                raise self.damaged("bad central directory entry")
            at = p + 46
            p = at + nlen + xlen + clen
            if p > end:
                raise self.damaged("a central directory entry runs past the directory")
            try:
                name = cd[at : at + nlen].decode("utf-8")
            except UnicodeDecodeError:
                raise self.damaged("an entry name is not UTF-8") from None
            if csize == usize == hoff == 0xFFFFFFFF and xlen >= 28:  # torch's: a zip64 extra of all three, first
                hid, hlen, u64, c64, h64 = zip64(cd, at + nlen)
                if hid != 1:
                    usize, csize, hoff = zip64_extra(cd, at + nlen, xlen, (usize, csize, hoff), self.damaged)
                elif hlen < 24:
                    raise self.damaged("a zip64 extra field is cut short")
                else:
                    usize, csize, hoff = u64, c64, h64
            elif 0xFFFFFFFF in (csize, usize, hoff):
                usize, csize, hoff = zip64_extra(cd, at + nlen, xlen, (usize, csize, hoff), self.damaged)
            if method != 0 or csize != usize:
                raise CorruptFileError(
                    f"{self.shown}: entry {shown(name)} is compressed (method {method}).",
                    hint="torch.save never compresses; the file was re-zipped. "
                    "Re-save it with torch.save or re-zip with `zip -0`.",
                )
            if name in entries:
                raise self.damaged("two entries have the same name")
            if hoff + 30 > cd_off or usize > size:
                raise self.damaged(f"entry {shown(name)} lies outside the file")
            entries[name] = new(ZipEntry, (name, hoff, usize, method, crc))  # ZipEntry._make, without its call
            spans.append((hoff, nlen + usize, name))
        self._bounds = self._entry_bounds(spans, cd_off)
        return entries

    def _entry_bounds(self, spans: list[tuple[int, int, str]], cd_off: int) -> dict[str, int]:
        """Where each entry must end: the next entry's local header (or the central directory). `spans`:
        (local header offset, name length + size, name) of each entry, in directory order.

        `torch.save` writes members one after another, so two records sharing bytes, or a record running
        into the directory, can only come from a damaged or crafted file: such a file is refused."""
        spans.sort(key=_FIRST)  # stable: records at one offset keep their directory order (torch's: in order)
        bounds: dict[str, int] = {}
        nexts = [s[0] for s in spans]
        nexts.append(cd_off)
        for (hoff, used, name), end in zip(spans, nexts[1:], strict=True):
            if hoff + 30 + used > end:
                raise self.damaged(f"record {name} overlaps the next member of the archive")
            bounds[name] = end
        return bounds

    def _find_prefix(self) -> str:
        """The one top folder every entry lives under (torch refuses an archive that mixes two)."""
        found = [n for n in filter(methodcaller("endswith", "data.pkl"), self.entries) if n.count("/") <= 1]
        if len(found) != 1:
            raise CorruptFileError(
                f"{self.shown}: {'no' if not found else 'more than one'} data.pkl in the archive; "
                "not a torch.save file.",
                hint="The file is damaged or was crafted; copy it again from the source.",
            )
        prefix = found[0][: -len("data.pkl")]
        if not (min(self.entries).startswith(prefix) and max(self.entries).startswith(prefix)):  # all between do
            raise CorruptFileError(
                f"{self.shown}: the archive mixes entries of two folders (torch refuses such a file).",
                hint="The file is damaged or was crafted; copy it again from the source.",
            )
        return prefix

    def data_offset(self, name: str) -> int:
        """Absolute file offset of an entry's bytes: local header + its own name/extra lengths."""
        return self.base + self._data_offset(name)

    def _data_offset(self, name: str, whole: bool = False) -> int:
        """The entry's bytes' offset inside the archive (its window, for an embedded one), from its local
        header's 30 fixed bytes, read with the pages after it (`page`: one read serves the headers of a rank
        file's small records side by side, and the copied-rank check's first bytes of a big one). `whole`:
        the caller reads the entry next, so the page read takes its bytes too (`pread` serves them)."""
        off = self._data_offsets.get(name)
        if off is not None and not whole:
            return off
        e = self.entries[name]
        at = e.header_offset
        page_at, page = self.page(at, 30 + (e.size if whole else 0))
        i = at - page_at
        if len(page) - i < 30:
            raise self.damaged(f"wanted 30 bytes at offset {at}")
        if page[i : i + 4] != _LOCAL:
            raise self.damaged(f"bad local header for {self.named(name)}")
        nlen, xlen = _LOCAL_LENGTHS.unpack_from(page, i + 26)
        off = at + 30 + nlen + xlen
        if off + e.size > self.file_size:
            raise self.damaged(f"record {self.named(name)} ends at byte {off + e.size}")
        if off + e.size > self._bounds[name]:
            raise self.damaged(f"record {self.named(name)} overlaps the next member of the archive")
        self._data_offsets[name] = off
        return off

    @property
    def repeats(self) -> Layout | None:
        """The layout of an earlier rank's archive this one repeats under its own prefix (`rankrepeat`)."""
        return self._layout

    def named(self, name: str) -> str:
        """An entry's name as this file writes it (the learnt archive's prefix swapped for its own)."""
        if self._layout is None or not name.startswith(self.prefix):
            return name
        return self.own_prefix + name[len(self.prefix) :]

    def read_entry(self, name: str, seen: Callable[[int, int], bytes | None] | None = None) -> bytes:
        """A whole member, proven by its CRC-32 from the central directory: bytes a store or a disk returned
        for another range (or damaged) are refused here, before anything parses them. `seen(length, crc)`:
        bytes that matched this CRC-32 before, if any (`replay.seen`): bytes equal to them match it too."""
        entry, off = self.entries[name], self._data_offset(name, whole=True)
        crc = entry.crc  # the learnt one's where this file repeats one; its own for a record holding bytes:
        if self._layout is not None and (at := self._layout.crc_of.get(name)) is not None:
            crc = int.from_bytes(self._own_tail[at : at + 4], "little")
        known = seen(entry.size, crc) if seen is not None else None
        if known is not None and (page := self._kept(off, entry.size)) and page[1].startswith(known, off - page[0]):
            return known  # the same bytes, compared where the page read holds them: no copy of a 200 KB pickle
        if (data := self.pread(entry.size, off)) != known and zlib.crc32(data) != crc:
            raise CorruptFileError(
                f"{self.shown}: member {shown(self.named(name))} does not match its CRC-32 in the zip directory.",
                hint="The file is damaged, or the store returned other bytes than the range asked for; "
                "copy it again from the source.",
                title="Checksum mismatch",
            )
        return data

    def record(self, key: str) -> tuple[int, int]:
        """(absolute offset, size) of storage record `data/<key>`."""
        entry = self.entries.get(self.prefix + "data/" + key)
        if entry is None:
            raise CorruptFileError(
                f"{self.shown}: the pickle refers to storage {key!r}, which is not in the archive.",
                hint="The file is damaged; copy it again from the source.",
            )
        return self.base + self._data_offset(entry.name), entry.size

    def storage(self, key: str, dtype: str, numel: int, view: tuple[str, int, int] | None) -> StorageRef:
        """The storage a persistent id names: its record, which must hold `numel` elements of `dtype` (the
        first id naming a key decides its dtype, as in torch). The zip form never writes storage views."""
        if view is not None:
            raise CorruptFileError(
                f"{self.shown}: storage {shown(key)} is a storage view, which the zip form never writes.",
                hint="The file is damaged or crafted; copy it again from the source.",
            )
        ref = self._storages.get(key)
        if ref is None:
            offset, size = self.record(key)
            need = numel * itemsize(dtype)
            if need > size:
                raise CorruptFileError(
                    f"{self.shown}: storage {shown(key)} should hold {need} bytes but the record has {size}.",
                    hint="The file is damaged; copy it again from the source.",
                )
            ref = self._storages[key] = StorageRef(self.path, key, dtype, offset, need)
        return ref

    def storages_for(
        self, requests: Iterable[tuple[str, str, int]], wanted: Collection[str] | None = None
    ) -> dict[str, StorageRef]:
        """`storage(key, dtype, numel, None)` of each request, by key: a replayed pickle's storages
        (`format/replay.py`: dozens a rank file, thousands of files) checked in one loop. A record whose local
        header lies in the page already read is checked here as `storage` checks it (it exists, its header is
        one, it ends inside the file and before the next member, it holds the bytes asked for); any other,
        and any refusal, goes through `storage` itself, so the words are the same (a big archive's many, as
        `zipdir.storages` checks them). `wanted`: the keys whose `StorageRef` the caller reads (None: all)."""
        if self._layout is not None and (again := rankrepeat.storages(self, self._layout, requests, wanted)):
            self._storages.update(again)  # the same replay on an earlier rank's archive: its verdicts
            return again
        return self._storages_for(requests, wanted)

    def _storages_for(
        self, requests: Iterable[tuple[str, str, int]], wanted: Collection[str] | None
    ) -> dict[str, StorageRef]:
        if (bulk := zipdir.storages(self, requests := list(requests), wanted)) is not None:  # many: at once
            self._storages.update(bulk)
            return bulk
        out: dict[str, StorageRef] = {}
        entries, have, bounds, stem = self.entries, self._storages, self._bounds, self.prefix + "data/"
        lengths, sizes = _LOCAL_LENGTHS.unpack_from, ITEMSIZE
        page_at, page = self._page
        for key, dtype, numel in requests:
            ref = have.get(key)
            if ref is None:
                entry = entries.get(stem + key)
                i = -1
                if entry is not None and dtype in sizes:
                    i = entry.header_offset - page_at
                    if (i < 0 or i + 30 > len(page)) and (found := self._kept(entry.header_offset, 30)):
                        page_at, page = found
                        i = entry.header_offset - page_at
                if entry is None or i < 0 or i + 30 > len(page) or not page.startswith(_LOCAL, i):
                    ref = self.storage(key, dtype, numel, None)
                else:
                    nlen, xlen = lengths(page, i + 26)
                    end = entry.header_offset + 30 + nlen + xlen + entry.size
                    need = numel * sizes[dtype]
                    if end > self.file_size or end > bounds[entry.name] or need > entry.size:
                        ref = self.storage(key, dtype, numel, None)
                    elif wanted is not None and key not in wanted:
                        continue  # checked; its record is not made
                    else:
                        ref = StorageRef(self.path, key, dtype, self.base + end - entry.size, need)
                        have[key] = ref
            out[key] = ref
        return out

    def storages(self) -> dict[str, StorageRef]:
        """The storages asked for so far, by key, in the order first asked for (a copy)."""
        return dict(self._storages)

    def byteorder(self) -> str:
        if (name := f"{self.prefix}byteorder") not in self.entries:
            return "little"
        if self.entries[name].size > 16:
            raise self.damaged("the byteorder record is not a byte order")
        return self.read_entry(name).decode("ascii", "replace").strip()
