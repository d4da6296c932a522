"""Where a checkpoint's bytes come from: a local folder or an object-store prefix, behind one small protocol.

Readers never call `os.pread` on a checkpoint file themselves: they open a `Handle` through the checkpoint's
`ByteSource` and ask it for bytes at an offset. Locally the handle is a descriptor opened by `Source` (the
confined, link-refusing opener); for a store URL (`s3://`, `gs://`, `az://`, any other fsspec protocol) it is
a ranged reader (`inspector.remote`, which imports a store's client only when such a URL is used). Both
refuse names that leave the root, both bound sizes, and neither puts file content into a message.

Paths stay strings: local ones are absolute paths, remote ones URLs (`s3://bucket/prefix/tag/file`), so the
scan's records, findings and plans are the same for both.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from typing import Any, Protocol, runtime_checkable

from inspector.system.source import Source, outside

# `scheme://`: s3, gs and az have a client of their own, any other scheme is tried as an fsspec protocol
_URL = re.compile(r"[A-Za-z][A-Za-z0-9+.:-]*://")


@runtime_checkable
class Handle(Protocol):
    """One open file: its size and positioned reads. Safe to share between threads."""

    path: str
    size: int

    def pread(self, n: int, offset: int) -> bytes:
        """Up to `n` bytes at `offset` (fewer only at the end of the file)."""
        ...

    def read_into(self, offset: int, view: memoryview) -> int:
        """Fill `view` from `offset`; returns the bytes read (fewer only at the end of the file)."""
        ...

    def fileno(self) -> int | None:
        """A local descriptor for kernel copies, or None for a remote object."""
        ...

    def close(self) -> None: ...


class ByteSource(Protocol):
    """A root the tool reads from (a folder or a bucket prefix); every path it serves stays below it."""

    @property
    def root(self) -> str: ...

    @property
    def label(self) -> str: ...

    def contains(self, path: str) -> bool: ...

    def open_handle(self, path: str) -> Handle: ...

    def read_bytes(self, path: str, limit: int, what: str = "file") -> bytes: ...

    def read_json(self, path: str, limit: int, what: str = "JSON file") -> Any: ...

    def kind(self, path: str) -> str: ...

    def is_file(self, path: str) -> bool: ...

    def is_dir(self, path: str) -> bool: ...

    def listdir(self, path: str = ".") -> list[str]: ...


def is_url(path: str | os.PathLike[str]) -> bool:
    """Whether `path` names an object-store location (`scheme://...`) rather than a local path."""
    return _URL.match(os.fspath(path)) is not None


def any_remote(sources: Iterable[ByteSource]) -> bool:
    """Whether any of `sources` is on an object store, where a read is a round trip: the plan's chunks, the
    reader's read-ahead and preflight's time all follow from it."""
    return any(is_url(src.root) for src in sources)


def absolute(path: str) -> str:
    """A user path made absolute (`~` expanded); a URL normalised (no trailing slash), never touched by
    `os.path`, which would turn `s3://b/p` into `/cwd/s3:/b/p`."""
    if is_url(path):
        from inspector.remote.backend import normalise_url

        return normalise_url(path)
    return os.path.abspath(os.path.expanduser(path))


def source_at(root: str, label: str = "folder") -> ByteSource:
    """The byte source for a root the user named: a confined local folder, or a bucket prefix."""
    if is_url(root):
        from inspector.remote.source import StoreSource

        return StoreSource.at(root, label)
    return Source.at(root, label)


def open_handle_in(path: str, sources: tuple[ByteSource, ...] = ()) -> Handle:
    """Open `path` through whichever of `sources` holds it (with none given, the file's own folder or
    prefix is the root, as `open_in` does for local files)."""
    if not sources:
        parent = os.path.dirname(path) if is_url(path) else os.path.dirname(os.path.abspath(path))
        full = path if is_url(path) else os.path.abspath(path)
        return source_at(parent).open_handle(full)
    for src in sources:
        if src.contains(path):
            return src.open_handle(path)
    raise outside(path, sources[0].root, sources[0].label)


# -- the few tree questions `locate` asks, for either kind of path ------------------------------------------
# Local answers are exactly the os calls they replace (links followed, as the locating logic expects; the
# confined `Source` checks each file when it is opened); remote answers come from the prefix listing.


def names_in(path: str) -> list[str]:
    """Every entry of a folder (OSError when there is no such folder, as os.listdir)."""
    if is_url(path):
        src = _remote(path)
        if src.kind(path) != "dir":
            raise FileNotFoundError(path)
        names: list[str] = src.listdir(path)
        return names
    return os.listdir(path)


def subdirs(path: str) -> list[str]:
    """The folders directly inside `path` (OSError when there is no such folder, as os.scandir)."""
    if is_url(path):
        src = _remote(path)
        return [n for n in names_in(path) if src.kind(src.join(path, n)) == "dir"]
    return [e.name for e in os.scandir(path) if e.is_dir()]


def is_dir(path: str) -> bool:
    return _remote(path).kind(path) == "dir" if is_url(path) else os.path.isdir(path)


def is_file(path: str) -> bool:
    return _remote(path).kind(path) == "file" if is_url(path) else os.path.isfile(path)


def exists(path: str) -> bool:
    return _remote(path).kind(path) != "missing" if is_url(path) else os.path.exists(path)


def size_and_mtime(path: str) -> tuple[int, int]:
    """A file's size and modification time in ns (which with the size identifies one save of it); OSError
    when it is missing (a dangling link, a vanished object)."""
    if is_url(path):
        return _remote(path).stat(path)
    st = os.stat(path)
    return st.st_size, st.st_mtime_ns


def _remote(path: str) -> Any:
    from inspector.remote.source import StoreSource

    return StoreSource.for_path(path)
