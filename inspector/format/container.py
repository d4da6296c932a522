"""What the two `torch.save` containers share: the zip form (`zipreader.TorchZip`) and the legacy form
(`legacy.LegacyTorchFile`) are both read by offset through one open handle, and a short read is damage, said in
each container's own words (`damaged`)."""

from __future__ import annotations

from functools import cached_property
from typing import Any, TypeVar

from inspector.errors import CorruptFileError
from inspector.text import shown

_C = TypeVar("_C", bound="Container")


class Container:
    """One open container file; `path` and `handle` are set by the subclass."""

    handle: Any
    path: str

    @cached_property
    def shown(self) -> str:
        """The path as messages name it (control characters escaped, secrets redacted): made when a message
        needs it, not for each of a save's thousands of rank files read without one."""
        return shown(self.path)

    def close(self) -> None:
        self.handle.close()

    def __enter__(self: _C) -> _C:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def pread(self, n: int, offset: int) -> bytes:
        data = self.handle.pread(n, offset)
        if len(data) != n:
            raise self.damaged(f"wanted {n} bytes at offset {offset}")
        return data

    def damaged(self, why: str) -> CorruptFileError:
        """The error for a file that is cut short or inconsistent, naming it and `why`."""
        raise NotImplementedError


class Window:
    """`[base, base+length)` of an open file as a file of its own (an archive embedded in a DCP item): reads
    past its end come back short."""

    def __init__(self, handle: Any, base: int, length: int, name: str) -> None:
        if base < 0 or length < 0 or base + length > handle.size:
            handle.close()
            raise CorruptFileError(
                f"{name}: an item at bytes [{base}, {base + length}) lies past the file's end "
                f"({handle.size} bytes).",
                hint="The file is truncated or is not the one the metadata describes; copy the folder again.",
            )
        self.inner, self.base, self.size = handle, base, length

    def pread(self, n: int, offset: int) -> bytes:
        n = max(0, min(n, self.size - offset))
        return self.inner.pread(n, self.base + offset) if offset >= 0 and n else b""

    def close(self) -> None:
        self.inner.close()
