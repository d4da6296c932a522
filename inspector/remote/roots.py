"""The one place a root the user named becomes a byte source: a confined local folder or a bucket prefix.

`system/` holds both kinds' protocol and the local one; this module, above it, decides once from what the
user named (a path or a `scheme://` URL) which kind a root is, and the scan, the converters and the faces
pass the source it returns down. Below this point nothing asks a path string whether it is remote:
`locate` and the other tree questions ask the source they were given. It imports the store code only for a
URL, so the core imports it at module level and a local run still loads no store code.
"""

from __future__ import annotations

import os

from inspector.system.bytesource import ByteSource, Handle, is_url, open_handle_in
from inspector.system.source import Source


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


def parent_source(path: str, label: str = "folder") -> ByteSource:
    """The source of the folder or prefix that holds `path`: for a file the user named directly."""
    full = absolute(path)
    return source_at(full.rsplit("/", 1)[0] if is_url(full) else os.path.dirname(full), label)


def open_file(path: str, sources: tuple[ByteSource, ...] = ()) -> Handle:
    """Open `path` through whichever of `sources` holds it; with none given, through its own folder or
    prefix (right for a file the user named directly; it still refuses a link, a FIFO, a name off the rule)."""
    if sources:
        return open_handle_in(path, sources)
    return parent_source(path).open_handle(absolute(path))
