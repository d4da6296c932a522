"""Where a checkpoint's bytes come from: a local folder or an object-store prefix, behind one small protocol.

Readers never call `os.pread` on a checkpoint file themselves: they open a `Handle` through the checkpoint's
`ByteSource` and ask it for bytes at an offset. Locally the source is `Source` (the confined, link-refusing
opener in `system.source`); for a store URL it is a `StoreSource` (`inspector.remote`). Which of the two a
root gets is decided once, from what the user named, above this layer (`remote.roots.source_at`), and the
source is passed down: nothing here imports `remote` (tests/test_boundaries.py). The tree questions the
locating logic asks (`names_in`, `subdirs`, `entry`, ...) are the source's own methods, so they are answered
by the kind of source chosen, never re-decided from a path string. Both refuse names that leave the root,
both bound sizes, and neither puts file content into a message.

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

    # -- what the source is, and the locating logic's tree questions (not confined to the root: `locate`
    # looks at a root's parent and follows links a user made; the confinement applies when a file is opened)

    @property
    def remote(self) -> bool:
        """Whether a read is a round trip to an object store (the plan's chunks, read-ahead and preflight's
        time follow from it)."""
        ...

    def rooted(self, root: str, label: str = "folder") -> ByteSource:
        """A source of the same kind at another root (a tag folder's parent, a Trainer run's checkpoint)."""
        ...

    def absolute(self, path: str) -> str:
        """A path as this kind of source spells it: absolute locally, a normalised URL on a store."""
        ...

    def entry(self, path: str) -> str:
        """ "file", "dir", "other" or "missing" (links followed; a dangling link is missing)."""
        ...

    def lexists(self, path: str) -> bool:
        """Whether anything, a dangling link included, has this name."""
        ...

    def names_in(self, path: str) -> list[str]:
        """Every entry of a folder (OSError when there is no such folder, as os.listdir)."""
        ...

    def subdirs(self, path: str) -> list[str]:
        """The folders directly inside `path` (OSError when there is no such folder, as os.scandir)."""
        ...

    def size_and_mtime(self, path: str) -> tuple[int, int]:
        """A file's size and modification time in ns (with the size, one save of it); OSError when missing."""
        ...


def is_url(path: str | os.PathLike[str]) -> bool:
    """Whether `path` names an object-store location (`scheme://...`) rather than a local path."""
    return _URL.match(os.fspath(path)) is not None


def any_remote(sources: Iterable[ByteSource]) -> bool:
    """Whether any of `sources` is on an object store, where a read is a round trip: the plan's chunks, the
    reader's read-ahead and preflight's time all follow from it."""
    return any(is_url(src.root) for src in sources)  # a source's root is a URL exactly when it is a store's


def open_handle_in(path: str, sources: tuple[ByteSource, ...]) -> Handle:
    """Open `path` through whichever of `sources` holds it; with none given, a local file through its own
    folder (a store URL needs the source it was found through: `remote.roots.open_file`)."""
    if not sources:
        if is_url(path):
            raise outside(path, os.path.dirname(path), "folder")
        full = os.path.abspath(path)
        return Source.at(os.path.dirname(full)).open_handle(full)
    if len(sources) == 1 and isinstance(sources[0], Source) and not is_url(path):
        return sources[0].open_handle(path)  # its own refusal of a path out of it is this one's, word for word
    for src in sources:
        if src.contains(path):
            return src.open_handle(path)
    raise outside(path, sources[0].root, sources[0].label)
