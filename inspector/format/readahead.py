"""One open file shared by the embedded archives it holds (a `.distcp` file's DCP items), with each archive's
small parts read ahead: the scan reads a file's items one after another through one descriptor instead of
opening the file again per item, and answers the zip reader's many small reads (end records, directory, local
headers, `data.pkl`, `byteorder`) from one or two reads per item.

What is read ahead is what `zipreader.TorchZip` asks for first: the archive's first page (local headers and
`data.pkl`, which `torch.save` writes first) and its last page (the directory and end records). An archive of
at most two pages is read whole in one read, since those two pages would cover it anyway. Any other read goes
to the file, so what the reader sees (and checks) is byte for byte what it would read without this. Only an
item read in full comes here (the first of its shape, or a damaged one): a repeat of it reads its head and
tail alone (`itemrepeat`).
"""

from __future__ import annotations

from inspector.system.bytesource import Handle

PAGE = 4096  # TorchZip's first end-record search and local-header reads are one page each


class ReadAhead:
    """`inner` (an open file the caller owns and closes) as a handle whose reads inside the current
    archive's first and last pages come from memory; `close` leaves `inner` open for the next archive."""

    def __init__(self, inner: Handle, path: str) -> None:
        self.inner = inner
        self.size = inner.size
        self.path = path  # as the file was opened: the path its archives' tensors name
        self._spans: tuple[tuple[int, bytes], ...] = ()

    def archive(self, base: int, length: int) -> ReadAhead:
        """Read ahead the archive at `[base, base+length)`: one read when it is at most two pages, else its
        first and last page. A window outside the file reads nothing (the zip reader refuses it)."""
        self._spans = ()
        if base < 0 or length <= 0 or base + length > self.size:
            return self
        if length <= 2 * PAGE:
            self._spans = ((base, self.inner.pread(length, base)),)
        else:
            tail = base + length - PAGE
            self._spans = ((base, self.inner.pread(PAGE, base)), (tail, self.inner.pread(PAGE, tail)))
        return self

    def pread(self, n: int, offset: int) -> bytes:
        for at, data in self._spans:
            if at <= offset and offset + n <= at + len(data):  # a short read ahead covers less, never more
                return data[offset - at : offset - at + n]
        return self.inner.pread(n, offset)

    def read_into(self, offset: int, view: memoryview) -> int:
        return self.inner.read_into(offset, view)

    def fileno(self) -> int | None:
        return self.inner.fileno()

    def close(self) -> None:
        """The archive is done; the file stays open for its owner."""
        self._spans = ()
