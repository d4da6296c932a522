"""A DCP item saved through the zstd extension (`stream.zstd/1`): the whole `torch.save` zip is one zstd
stream at `[offset, offset+length)` of its file, so its tensor bytes have no offset in the file.

Such an item is read as a file of its own, named by a path under its `.distcp` file
(`<file>/zstd-item@<offset>+<length>+<size>`: no real file can be there, since `<file>` is a file). Its
handle decompresses forward from the item's start, restarting when asked for bytes behind it, and never
holds more than one read's worth: the zip reader, the scan and the convert reader read it by offset like any
file. Its size is learned once, at scan, by one streaming pass that refuses anything past what the chunk's
dtype and sizes allow (a zip bomb); a reader opening the path later reads no further than that size.
`zstandard` (the `zstd` extra) is imported only when such an item is read.
"""

from __future__ import annotations

import os
import re
import threading
from typing import Any

from inspector.errors import CorruptFileError, UnsupportedCheckpointError
from inspector.system.bytesource import ByteSource, Handle, open_handle_in
from inspector.text import shown

OVERHEAD = 64 << 10  # a one-tensor torch.save zip beside its data: ~1.5 KB (FORMAT.md); far below this
_KEEP = 64 << 10  # the first and last bytes kept from the sizing pass: data.pkl and the zip directory
_STEP = 1 << 20  # bytes decompressed per call while skipping forward
_PATH = re.compile(r"(.+)/zstd-item@(\d{1,19})\+(\d{1,19})\+(\d{1,19})", re.S)


def item_path(file: str, offset: int, length: int, size: int) -> str:
    """The path a compressed item is read through: its file, where it lies, and its decompressed size."""
    return f"{file}/zstd-item@{offset}+{length}+{size}"


def parse_item_path(path: str) -> tuple[str, int, int, int] | None:
    """(file, offset, length, size) of a compressed item's path; None for any other path."""
    m = _PATH.fullmatch(path)
    return None if m is None else (m[1], int(m[2]), int(m[3]), int(m[4]))


def require_zstandard() -> Any:
    """The `zstandard` module, or a refusal that says how to get it."""
    try:
        import zstandard
    except ImportError:
        raise UnsupportedCheckpointError(
            "This PyTorch Distributed Checkpoint's items are zstd-compressed (DCP's `stream.zstd/1` "
            "extension), and the `zstandard` package that reads them is not installed.",
            hint="pip install 'zero-inspector[zstd]' (or zstandard), then run the same command again.",
            title="zstandard not installed",
        ) from None
    return zstandard


class _Compressed:
    """The item's compressed bytes as a stream read from the start (what the decompressor pulls)."""

    def __init__(self, handle: Handle, base: int, length: int) -> None:
        self.handle, self.base, self.length, self.pos = handle, base, length, 0

    def read(self, n: int = -1) -> bytes:
        n = self.length - self.pos if n < 0 else min(n, self.length - self.pos)
        data = self.handle.pread(n, self.base + self.pos) if n > 0 else b""
        self.pos += len(data)
        return data


class ZstdItem:
    """A compressed item's decompressed bytes as a read-only handle (pread / read_into by offset).

    `size` None: learn it now, in one streaming pass bounded by `bound`; given: trust it as the most this
    handle will ever decompress (the scan learned it under the bound). Thread-safe: one stream, locked."""

    def __init__(
        self,
        inner: Handle,
        name: str,
        base: int,
        length: int,
        bound: int,
        size: int | None,
        owns_inner: bool = True,
    ) -> None:
        self.inner, self.name, self.base, self.length = inner, name, base, length
        self.owns_inner = owns_inner  # False: the file's handle is shared by its items (FilePool's)
        self.path = name
        self._lock = threading.Lock()
        self._zstd = require_zstandard()
        if base < 0 or length < 0 or base + length > inner.size:
            self._release()
            raise self._bad(f"the item at bytes [{base}, {base + length}) lies past the file's end")
        self._head = self._tail = b""
        self._tail_at = 0
        self.size = size if size is not None else self._measure(bound)
        self._stream: Any = None
        self._pos = 0

    def _bad(self, why: str) -> CorruptFileError:
        return CorruptFileError(
            f"{self.name}: a zstd-compressed item cannot be read ({why}).",
            hint="The file is damaged or is not the one the metadata describes; copy the folder again.",
        )

    def _open(self) -> Any:
        dctx = self._zstd.ZstdDecompressor()
        return dctx.stream_reader(_Compressed(self.inner, self.base, self.length))  # one frame, as torch

    def _read(self, stream: Any, n: int) -> bytes:
        try:
            data: bytes = stream.read(n)
        except self._zstd.ZstdError as exc:
            raise self._bad(f"the zstd stream is damaged: {shown(str(exc))}") from None
        return data

    def _read_into(self, stream: Any, view: memoryview) -> int:
        try:
            got: int = stream.readinto(view)
        except self._zstd.ZstdError as exc:
            raise self._bad(f"the zstd stream is damaged: {shown(str(exc))}") from None
        return got

    def _measure(self, bound: int) -> int:
        """The decompressed size, streamed once and refused past `bound`; head and tail kept."""
        stream, total, tail = self._open(), 0, b""
        try:
            while data := self._read(stream, _STEP):
                total += len(data)
                if total > bound:
                    raise self._bad(
                        f"it decompresses to more than {bound:,} bytes, all its chunk and a zip around it "
                        "can take"
                    )
                if len(self._head) < _KEEP:
                    self._head += data[: _KEEP - len(self._head)]
                tail = (tail + data)[-_KEEP:]
        finally:
            stream.close()
        self._tail, self._tail_at = tail, total - len(tail)
        return total

    def pread(self, n: int, offset: int) -> bytes:
        buf = bytearray(max(0, min(n, self.size - offset)) if offset >= 0 else 0)
        got = self.read_into(offset, memoryview(buf)) if buf else 0
        return bytes(buf[:got])

    def read_into(self, offset: int, view: memoryview) -> int:
        """Fill `view` from `offset` of the decompressed item; short only at its end."""
        n = max(0, min(len(view), self.size - offset))
        if n == 0 or offset < 0:
            return 0
        if offset + n <= len(self._head):
            view[:n] = self._head[offset : offset + n]
            return n
        if self._tail and offset >= self._tail_at:
            view[:n] = self._tail[offset - self._tail_at : offset - self._tail_at + n]
            return n
        with self._lock:
            if self._stream is None or offset < self._pos:
                if self._stream is not None:
                    self._stream.close()
                self._stream, self._pos = self._open(), 0
            while self._pos < offset:
                skipped = self._read(self._stream, min(_STEP, offset - self._pos))
                if not skipped:
                    raise self._bad(f"it ends at byte {self._pos}, before byte {offset}")
                self._pos += len(skipped)
            done = 0
            while done < n:  # straight into `view`, a piece at a time: no second copy of a big read
                got = self._read_into(self._stream, view[done : min(n, done + _STEP)])
                if not got:
                    raise self._bad(f"it ends at byte {self._pos}, before byte {offset + n}")
                done += got
                self._pos += got
            if self._pos >= self.size:  # read to its end: the decompressor's window is freed now, not at
                self._stream.close()  # close, so a pool holding many items holds no window for each
                self._stream = None
        return n

    def fileno(self) -> int | None:
        return None  # no descriptor: no kernel copy, no page-cache probe

    def close(self) -> None:
        with self._lock:
            if self._stream is not None:
                self._stream.close()
                self._stream = None
        self._release()

    def _release(self) -> None:
        if self.owns_inner:
            self.inner.close()


def open_item(path: str, sources: tuple[ByteSource, ...], inner: Handle | None = None) -> ZstdItem:
    """Open a compressed item's path (`item_path`, made by the scan) through the sources its file is
    confined to; it decompresses no further than the size the path names. `inner`: its file already open
    (opened through the same sources) and shared, left open when the item closes: one descriptor per file,
    not per item."""
    parsed = parse_item_path(path)
    if parsed is None:
        raise ValueError(path)
    file, base, length, size = parsed
    own = inner is None
    handle = open_handle_in(file, sources) if inner is None else inner
    return ZstdItem(handle, shown(path), base, length, size, size, owns_inner=own)


def measure_item(file: str, source: ByteSource, base: int, length: int, bound: int) -> ZstdItem:
    """Open a compressed item of `file` for the first time: its size learned under `bound`."""
    inner = open_handle_in(file, (source,))
    return ZstdItem(inner, shown(os.path.join(file, f"zstd-item@{base}")), base, length, bound, None)
