"""A checkpoint under a store URL (`s3://`, `gs://`, `az://`, any fsspec URL), read as a confined byte source.

The same boundary as a local folder, for every store: every name a listing returns passes the one name rule
(`..`, a separator, control characters and over-long names are dropped, so they can never become a path or
reach the terminal); a URL with such a segment, or a path that leaves the prefix, is refused; a size a
listing declares is bounded before anything trusts it (`remote.store`); object content is never shown.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass, field
from typing import Any

from inspector.errors import CorruptFileError, InspectorError, StoreError
from inspector.remote.backend import normalise_url, split_url
from inspector.remote.store import ObjectInfo, Store, store_for
from inspector.system.source import not_regular, os_error, outside, parse_json, resolves
from inspector.text import shown


@dataclass(frozen=True)
class StoreSource:
    """A bucket prefix the tool reads from, with the same questions and answers as a local `Source`. Holds
    only its URL, so it pickles (the store and its client are found again in each process)."""

    root: str
    label: str = field(default="folder", compare=False)

    @classmethod
    def at(cls, url: str, label: str = "folder") -> StoreSource:
        return cls(normalise_url(url), label)

    @classmethod
    def for_path(cls, url: str) -> StoreSource:
        """The whole bucket of `url`: for tree questions that need no tighter root."""
        scheme, bucket, _ = split_url(url)
        return cls(f"{scheme}://{bucket}")

    @property
    def store(self) -> Store:
        scheme, bucket, _ = split_url(self.root)
        return store_for(scheme, bucket)

    def join(self, path: str, *names: str) -> str:
        return "/".join([path.rstrip("/"), *names])

    def resolve(self, path: str | os.PathLike[str]) -> str:
        raw = os.fspath(path)
        full = raw if "://" in raw else self.join(self.root, raw)
        try:
            full = normalise_url(full)
        except InspectorError:
            raise outside(full, self.root, self.label) from None
        if not self.holds(full):
            raise outside(full, self.root, self.label)
        return full

    def holds(self, real: str) -> bool:
        return real == self.root or real.startswith(self.root + "/")

    def contains(self, path: str | os.PathLike[str]) -> bool:
        return resolves(self, path)

    def _entry(self, url: str) -> tuple[str, ObjectInfo | None]:
        _, _, parts = split_url(url)
        store = self.store
        if not parts:
            store.listing("")  # the bucket must exist and be readable
            return "dir", None
        try:
            listing = store.listing("".join(p + "/" for p in parts[:-1]))
        except StoreError as exc:  # the folder was listed to learn what `url` is: name what was asked for too
            raise StoreError(f"Looking up {url}: {exc.message}", hint=exc.hint, title=exc.title) from None
        info = listing.files.get(parts[-1])
        if info is not None:
            return ("file" if info.size >= 0 else "other"), info
        return ("dir" if parts[-1] in listing.dirs else "missing"), None

    def kind(self, path: str | os.PathLike[str]) -> str:
        """ "file", "dir", "outside", "other" (a declared size no object has) or "missing"."""
        try:
            url = self.resolve(path)
        except InspectorError:
            return "outside"
        return self._entry(url)[0]

    def is_file(self, path: str | os.PathLike[str]) -> bool:
        return self.kind(path) == "file"

    def is_dir(self, path: str | os.PathLike[str]) -> bool:
        return self.kind(path) == "dir"

    def listdir(self, path: str | os.PathLike[str] = ".") -> list[str]:
        url = self.resolve(self.root if os.fspath(path) == "." else path)
        if self._entry(url)[0] != "dir":
            raise os_error(url, FileNotFoundError())
        _, _, parts = split_url(url)
        listing = self.store.listing("".join(p + "/" for p in parts))
        return sorted({*listing.files, *listing.dirs})

    def stat(self, path: str) -> tuple[int, int]:
        """(size, mtime in ns) of an object; OSError when there is none."""
        kind, info = self._entry(self.resolve(path))
        if kind != "file" or info is None:
            raise FileNotFoundError(path)
        return info.size, info.mtime_ns

    # -- what it is, and the locating logic's tree questions: answered from the listings of the whole bucket
    # (`locate` looks at a root's parent), under the same name rule; a store has no links

    @property
    def remote(self) -> bool:
        return True

    def rooted(self, root: str, label: str = "folder") -> StoreSource:
        return StoreSource.at(root, label)

    def absolute(self, path: str) -> str:
        return normalise_url(path)

    def entry(self, path: str) -> str:
        kind = StoreSource.for_path(path).kind(path)
        return "missing" if kind == "outside" else kind

    def lexists(self, path: str) -> bool:
        return self.entry(path) != "missing"

    def names_in(self, path: str) -> list[str]:
        whole = StoreSource.for_path(path)
        if whole.kind(path) != "dir":
            raise FileNotFoundError(path)
        return whole.listdir(path)

    def subdirs(self, path: str) -> list[str]:
        return [n for n in self.names_in(path) if self.entry(self.join(path, n)) == "dir"]

    def size_and_mtime(self, path: str) -> tuple[int, int]:
        return StoreSource.for_path(path).stat(path)

    def open_handle(self, path: str | os.PathLike[str]) -> Any:
        from inspector.remote.ranged import RangedHandle

        url = self.resolve(path)
        kind, info = self._entry(url)
        if kind == "missing":
            raise os_error(url, FileNotFoundError())
        if kind == "dir":
            raise not_regular(url, stat.S_IFDIR)
        if info is None or info.size < 0:
            raise CorruptFileError(
                f"{shown(url)}: the store declares a size no object can have; it was not read.",
                hint="The listing is damaged or the endpoint is not a real object store.",
                title="Impossible size",
            )
        _, _, parts = split_url(url)
        return RangedHandle(self.store, url, "/".join(parts), info.size, info.etag)

    def read_bytes(self, path: str | os.PathLike[str], limit: int, what: str = "file") -> bytes:
        """A whole small object, refused if larger than `limit` bytes (before a byte of it is fetched)."""
        handle = self.open_handle(path)
        if handle.size > limit:
            raise CorruptFileError(
                f"{shown(handle.path)}: too large for a {what} (over {limit:,} bytes); it was not read.",
                hint="Replace it with the real file.",
            )
        data: bytes = handle.pread(handle.size, 0)
        return data

    def read_json(self, path: str | os.PathLike[str], limit: int, what: str = "JSON file") -> Any:
        return parse_json(self.read_bytes(path, limit, what), os.fspath(path), what)
