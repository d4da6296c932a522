"""Any other fsspec protocol (`hf://`, `https://`, `memory://`, `gcs://`, ...): fsspec (the `fsspec` extra) plus
the protocol's own package (huggingface_hub for hf://, aiohttp for http(s)://, gcsfs for gcs://).

Only two calls are made: `fs.ls(path, detail=True)` for one folder level and `fs.cat_file(path, start, end)`
for exactly one range. Never `open()` (an s3fs file object reads ahead 50 MiB for a 1 MB read) nor
`cat_ranges` (which holds every result in memory at once): our own slots and pools bound what is in flight.
Options and credentials come from fsspec's environment (FSSPEC_<PROTOCOL>_<OPTION>, e.g. FSSPEC_HF_TOKEN)
and the protocol's own (HF_TOKEN). There is no ETag check: a ranged read through fsspec cannot carry one.

A ranged read is trusted only where the bytes are shown to be the range asked: over `http(s)://` the read is
made on fsspec's session with the answer's status and Content-Range checked (`remote.http`); `memory://`
lives in this process. Any other protocol's client hides what the server answered, so its ranged reads are
refused (`errors.unproven`) rather than trusted.
"""

from __future__ import annotations

import numbers
import re
from collections.abc import Iterator
from datetime import datetime
from typing import Any

from inspector.errors import InspectorError
from inspector.remote import errors as err
from inspector.remote import http
from inspector.remote.backend import Page, RawObject, scheme_row

MAX_SIZE_QUERIES = 4096  # one folder's files without a listed size asked one by one; past that, unreadable
_HINT = "Check the URL, the network, and the protocol's options (FSSPEC_<PROTOCOL>_<OPTION> variables)."


def _package_for(scheme: str) -> str:
    """The package fsspec needs for `scheme` (gcs: gcsfs, sftp: paramiko), from fsspec's own table of known
    implementations: the class's package, or the one its message names when the class is fsspec's own."""
    from fsspec.registry import known_implementations  # `fsspec.registry` itself is the registry mapping

    known = known_implementations.get(scheme, {})
    package = str(known.get("class", "")).split(".")[0]
    if package and package != "fsspec":
        return package
    named = re.search(r'"([A-Za-z0-9_.\-]+)"|install ([A-Za-z0-9_.\-]+)', str(known.get("err", "")))
    return next((g for g in named.groups() if g), "") if named else "its fsspec implementation"


class FsspecBackend:
    """One root (`proto://first-segment`) of one fsspec file system; fsspec's instances are thread-safe for
    `ls` and `cat_file` (async ones run on fsspec's own loop)."""

    def __init__(self, scheme: str, bucket: str) -> None:
        try:
            import fsspec
        except ImportError:
            raise err.missing_client(f"{scheme}://", "fsspec", "fsspec") from None
        self.scheme, self.bucket = scheme, bucket
        url = f"{scheme}://{bucket}"
        try:
            cls = fsspec.get_filesystem_class(scheme)
        except ImportError:
            raise err.missing_client(f"{scheme}://", _package_for(scheme), "fsspec") from None
        except ValueError:
            raise err.misconfigured(
                url, f"fsspec knows no {scheme}:// file system; install the package that provides it."
            ) from None
        bounded = http.options() if scheme in http.SCHEMES else {}
        try:  # options from fsspec.config (FSSPEC_* variables), plus the time bounds of every request
            self.fs: Any = fsspec.filesystem(scheme, **bounded)
        except Exception as exc:
            raise err.misconfigured(url, f"{_HINT} ({type(exc).__name__})") from None
        self.ranges = http.HttpRanges(self.fs) if scheme in http.SCHEMES else None
        self._strip = cls._strip_protocol
        self.base = self._strip(url).rstrip("/")

    def url(self, key: str) -> str:
        return f"{self.scheme}://{self.bucket}/{key}"

    def _key(self, name: object) -> str | None:
        """A listed name as a key below the root, or None when it lies elsewhere (never shown)."""
        if not isinstance(name, str):
            return None
        path = self._strip(name)
        if not isinstance(path, str) or not path.startswith(self.base + "/"):
            return None
        return path[len(self.base) + 1 :]

    def list(self, prefix: str) -> Iterator[Page]:
        url = self.url(prefix)
        target = url if prefix else url.rstrip("/") + "/"
        try:
            # our store keeps listings for a few seconds; fsspec's own cache would outlive them
            self.fs.invalidate_cache(self._strip(target))
            entries = self.fs.ls(target, detail=True)
        except FileNotFoundError:
            yield Page([], [])
            return
        except Exception as exc:
            raise self.error(exc, url) from None
        dirs: list[object] = []
        objects: list[RawObject] = []
        asked = 0
        for entry in entries if isinstance(entries, list) else ():
            if not isinstance(entry, dict):
                continue
            key = self._key(entry.get("name"))
            if key is None:
                continue
            if entry.get("type") == "directory":
                dirs.append(key.rstrip("/") + "/")
            else:
                size = entry.get("size")
                if size is None and asked < MAX_SIZE_QUERIES and _direct(key, prefix):
                    asked += 1
                    size = self._size(key)  # http(s) listings name files without sizes
                objects.append(RawObject(key, _int(size), _mtime(entry), _etag(entry)))
        yield Page(dirs, objects)

    def _size(self, key: str) -> object:
        try:
            return self.fs.info(self.url(key)).get("size")
        except Exception:
            return None  # listed without a size the store will state: an object it cannot be read as

    def get_range(
        self, key: str, start: int, view: memoryview, size: int, etag: str
    ) -> InspectorError | None:
        url, n = self.url(key), len(view)
        if self.ranges is not None:
            return self.ranges.get(url, start, view, size)
        if scheme_row(self.scheme).proof is None:  # the scheme table: memory:// is in this process
            raise err.unproven(url, self.scheme)
        try:
            data = self.fs.cat_file(url, start=start, end=start + n)
        except FileNotFoundError:
            raise err.gone(url) from None
        except PermissionError:
            raise self.error(PermissionError(), url) from None
        except (OSError, TimeoutError) as exc:  # a broken connection: the caller fetches the range again
            return self.error(exc, url)
        except Exception as exc:
            raise self.error(exc, url) from None
        if not isinstance(data, bytes | bytearray | memoryview) or len(data) != n:
            raise err.truncated(url, f"the store did not return the {n} bytes asked for at {start}")
        view[:] = data
        return None

    def error(self, exc: BaseException, url: str) -> InspectorError:
        """A file system's failure as a user error: its kind only, never its text."""
        if isinstance(exc, PermissionError):
            return err.denied(url, "permission", f"The credentials in use may not read it. {_HINT}")
        if isinstance(exc, ConnectionError | TimeoutError) or "connect" in type(exc).__name__.lower():
            return err.unreachable(url, f"{self.scheme}://{self.bucket}", _HINT)
        return err.client_failed(url, type(exc).__name__, _HINT)


def _direct(key: str, prefix: str) -> bool:
    """Whether `key` is a plain name directly below `prefix` (only those are worth a request)."""
    return key.startswith(prefix) and bool(key[len(prefix) :]) and "/" not in key[len(prefix) :]


def _int(value: object) -> object:
    """A size as an int when it is a whole number (some file systems list floats); anything else as is."""
    if isinstance(value, numbers.Integral) and not isinstance(value, bool):
        return int(value)
    return value


def _mtime(entry: dict[str, Any]) -> int:
    for name in ("mtime", "LastModified", "last_modified", "updated", "created"):
        when = entry.get(name)
        if isinstance(when, datetime):
            return int(when.timestamp() * 1e9)
        if isinstance(when, int | float) and not isinstance(when, bool) and 0 <= when < 1e11:
            return int(when * 1e9)
    return 0


def _etag(entry: dict[str, Any]) -> object:
    for name in ("ETag", "etag", "md5", "sha256", "blob_id", "last_commit"):
        value = entry.get(name)
        if isinstance(value, str):
            return value
    return ""
