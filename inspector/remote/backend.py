"""The one small protocol every object-store client sits behind, and the URL rule that picks one.

A backend is one bucket (an S3 or GCS bucket, an Azure container, an fsspec host or root) on one kind of
store, and is the only code that talks to that store's client. It answers two questions, raw: what is one
folder level below a prefix (`list`), and what are the bytes of an object from an offset (`get_range`, into
the caller's buffer). Everything a backend returns is unchecked; `remote.store` applies the name rule and the
size bounds, counts requests and bytes, caches listings and bounds what is in flight, once for all of them.
A backend turns its client's failures into user errors (`remote.errors`) and imports its client lazily;
`remote.store.backend_for` builds one from the table below. The settings every backend shares (`inflight`,
`int_env`, the time bounds) live here, at the bottom, so no backend imports the store that holds it.

Everything the tool knows about a scheme is one row of `SCHEMES` (as fsspec's `known_implementations`): the
backend class, the package and extra to install, the label for messages, whether it is read and written (and
by which output `Destination`: `remote.destination.destination_for`), and what proves its ranged reads. A scheme not in the table is tried as an fsspec protocol (`FSSPEC`), whose
ranged reads are refused: its client hides what the server answered.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Protocol

from inspector.errors import InspectorError, NotACheckpointError, StoreError
from inspector.parse.names import name_problem
from inspector.remote.errors import missing_client
from inspector.text import shown

_SCHEME = re.compile(r"([a-z][a-z0-9+.-]*)://")
_BUCKET = re.compile(r"[a-z0-9][a-z0-9.\-_]{1,61}[a-z0-9]")  # S3, GCS and Azure container names alike


@dataclass(frozen=True)
class Scheme:
    """One row of the scheme table."""

    backend: str  # "module:Class", imported on first use
    package: str  # the client package a missing import names
    extra: str  # pip install 'zero-inspector[extra]'
    label: str  # the store's name in messages
    readable: bool = True
    writable: bool = False  # an OUT may be a prefix here
    destination: str = ""  # "module:Class" of its output Destination (remote.upload.destination_for)
    proof: str | None = None  # what shows a ranged read returned the range asked; None: refused


_FS = "inspector.remote.fs:FsspecBackend"
_CLOUD = "inspector.remote.cloud:CloudBackend"
_CLOUD_OUT = "inspector.remote.cloud_upload:CloudDestination"
_LISTED_ETAG = "ranges proven by the answer's range and the listed ETag"
SCHEMES: dict[str, Scheme] = {
    "s3": Scheme(
        "inspector.remote.s3:S3Backend", "boto3", "s3", "S3", writable=True,
        destination="inspector.remote.upload:BucketDestination",
        proof="ranges proven by Content-Range and the listed ETag",
    ),
    "gs": Scheme(
        _CLOUD, "obstore", "gcs", "Google Cloud Storage", writable=True, destination=_CLOUD_OUT,
        proof=_LISTED_ETAG,
    ),
    "az": Scheme(
        _CLOUD, "obstore", "azure", "Azure Blob Storage", writable=True, destination=_CLOUD_OUT,
        proof=_LISTED_ETAG,
    ),
    "http": Scheme(_FS, "aiohttp", "fsspec", "HTTP", proof="ranges proven by Content-Range"),
    "https": Scheme(_FS, "aiohttp", "fsspec", "HTTPS", proof="ranges proven by Content-Range"),
    "memory": Scheme(_FS, "fsspec", "fsspec", "fsspec memory", proof="in this process"),
    # fsspec protocols that are no store: local files (read those by path, through the confined local source),
    # wrappers that cache onto the local disk or read archives, and inline data
    **{
        name: Scheme(_FS, "fsspec", "fsspec", name, readable=False)
        for name in (
            "file", "local", "asynclocal", "dir", "cached", "filecache", "simplecache", "blockcache",
            "generic", "reference", "zip", "tar", "libarchive", "async_wrapper", "asyncwrapper", "data",
        )
    },
}  # fmt: skip
FSSPEC = Scheme(_FS, "fsspec", "fsspec", "fsspec")  # any other protocol: listed, its ranged reads refused


def scheme_row(name: str) -> Scheme:
    """The table's row for a scheme, or the fsspec row for one it does not name. ZI_S3_CLIENT=obstore reads
    and writes `s3://` through obstore, as gs:// and az:// (the client the paired measurement compares)."""
    if name == "s3" and os.environ.get("ZI_S3_CLIENT") == "obstore":
        return replace(SCHEMES["s3"], backend=_CLOUD, package="obstore", destination=_CLOUD_OUT)
    return SCHEMES.get(name, FSSPEC)


def client_missing(scheme: str) -> StoreError:
    """The refusal when a scheme's client library is not installed, naming the package and the extra its row
    gives (the S3 and obstore backends both raise it from their lazy import)."""
    row = scheme_row(scheme)
    return missing_client(f"{scheme}://", row.package, row.extra)


@dataclass(frozen=True)
class RawObject:
    """One object as a listing returned it: nothing here is trusted until `remote.store` checks it."""

    key: object  # the whole key within the bucket
    size: object
    mtime_ns: object
    etag: object


@dataclass(frozen=True)
class Page:
    """One page of a folder listing: sub-prefixes (whole keys, trailing `/` optional) and objects."""

    dirs: Sequence[object]
    objects: Sequence[RawObject]


class Backend(Protocol):
    """One bucket on one kind of store. Thread-safe: several ranged reads run at once."""

    def list(self, prefix: str) -> Iterator[Page]:
        """One folder level below `prefix` ("" or ending in "/"), page by page; a missing folder is empty."""
        ...

    def get_range(
        self, key: str, start: int, view: memoryview, size: int, etag: str
    ) -> InspectorError | None:
        """Fill `view` with the object's bytes from `start`, exactly (an answer of another length, or from an
        object of another size or ETag, is refused). Returns None when filled, or the error to raise if the
        body broke off midway after every retry (the caller retries such a read; any other failure raises)."""
        ...


def split_url(url: str) -> tuple[str, str, list[str]]:
    """(scheme, bucket, key components) of a store URL; a component that is not a plain name is refused."""
    m = _SCHEME.match(url)
    if m is None:
        raise NotACheckpointError(
            f"{shown(url)} is not a store URL this tool reads.",
            hint="Write it as scheme://bucket/prefix, e.g. s3://bucket/run, gs://bucket/run, az://container/run.",
            title="Unsafe URL",
        )
    scheme = m.group(1)
    if not SCHEMES.get(scheme, FSSPEC).readable:
        raise NotACheckpointError(
            f"{shown(url)}: {scheme}:// is read as a local path or not at all.",
            hint="Give a local checkpoint as a plain path.",
            title="Unsupported URL",
        )
    rest = url[m.end() :].rstrip("/")
    bucket, _, key = rest.partition("/")
    if "@" in bucket:  # user:password@host: not shown, not used
        raise NotACheckpointError(
            f"A {scheme}:// URL with credentials in it is refused (it is not shown, so they stay private).",
            hint="Give credentials through the store's environment variables, never in the URL.",
            title="Unsafe URL",
        )
    named = SCHEMES.get(scheme, FSSPEC).backend != _FS  # bucket-named stores: S3, GCS, Azure
    if (named and not _BUCKET.fullmatch(bucket)) or name_problem(bucket) or any(c in bucket for c in "?#"):
        raise NotACheckpointError(
            f"{shown(url)}: {shown(bucket)!s} is not a valid bucket name.",
            hint=f"A URL reads {scheme}://bucket/prefix/to/checkpoint.",
        )
    parts = key.split("/") if key else []
    # `?` and `#` are plain characters of an S3, GCS or Azure key (each client quotes the key it sends); in
    # any other URL they start a query or a fragment, which is not followed
    odd = "" if named else "?#"
    if any(name_problem(p) or any(c in p for c in odd) for p in parts):
        raise NotACheckpointError(
            f"{shown(url)} is not a plain object path: `.`, `..`, empty segments, control characters and "
            "queries are not followed in a URL.",
            hint=f"Write the prefix as the store lists it, e.g. {scheme}://bucket/run/global_step100.",
            title="Unsafe URL",
        )
    return scheme, bucket, parts


def normalise_url(url: str) -> str:
    scheme, bucket, parts = split_url(url)
    return "/".join([f"{scheme}://{bucket}", *parts])


def provenance(root: str) -> str:
    """Where a root's bytes were read from and what proved them, for `verify`'s report."""
    m = _SCHEME.match(root)
    if m is None:
        return f"read from {shown(root)} (local files)"
    return f"read from {shown(root)} ({scheme_row(m.group(1)).proof or 'ranges unproven: refused'})"


MAX_LISTING = 200_000  # objects in one folder; a rank folder of a 100k-GPU run holds ~200k files


def int_env(name: str, default: int, low: int, high: int) -> int:
    """An integer setting from the environment, clamped to [low, high]; the default where it is no integer."""
    try:
        return min(high, max(low, int(os.environ.get(name, default))))
    except ValueError:
        return default


def float_env(name: str, default: float, low: float, high: float) -> float:
    """A number of seconds from the environment, clamped to [low, high]; the default where it is no number."""
    try:
        value = float(os.environ.get(name, default))
    except ValueError:
        return default
    return default if value != value else min(high, max(low, value))  # NaN: the default


# Every store request is bounded three ways, for every backend (s3: botocore's connect and read timeouts and
# a timer on the headers and the body, remote.s3_deadline; gs/az: obstore's connect timeout and per-request
# timeout; http(s): aiohttp's sock_connect, sock_read and total): a silent or dripping server ends in a clear
# error naming the URL.
CONNECT_TIMEOUT = ("ZI_REMOTE_CONNECT_TIMEOUT", 10.0)  # to open a connection
STALL_TIMEOUT = ("ZI_REMOTE_STALL_TIMEOUT", 60.0)  # between two bytes of an answer
DEADLINE = ("ZI_REMOTE_DEADLINE", 300.0)  # one request, first byte sent to last byte read
# curl's --speed-limit / --speed-time: a body that arrives slower than this many bytes a second over any
# window this long is ended (s3:// and http(s)://, whose bodies are read as they arrive), however it paces
# its bytes inside the stall timeout
LOW_SPEED = ("ZI_REMOTE_LOW_SPEED", 1024.0)
LOW_SPEED_TIME = ("ZI_REMOTE_LOW_SPEED_TIME", 30.0)


def connect_timeout() -> float:
    return float_env(*CONNECT_TIMEOUT, 0.05, 600.0)


def stall_timeout() -> float:
    return float_env(*STALL_TIMEOUT, 0.05, 3600.0)


def deadline() -> float:
    return float_env(*DEADLINE, 0.05, 86400.0)


class LowSpeed:
    """Counts one answer's body as it arrives and ends it, as a timed-out request naming `url`, once a whole
    window (`LOW_SPEED_TIME`) has brought fewer than `LOW_SPEED` bytes a second: a server that drips a byte
    now and then never trips the stall timeout (it bounds the silence between two reads, not the rate)."""

    def __init__(self, url: str) -> None:
        import time

        self.url, self.clock = url, time.monotonic
        self.rate = float_env(*LOW_SPEED, 0.0, 1e12)
        self.window = float_env(*LOW_SPEED_TIME, 0.05, 3600.0)
        self.since, self.count = self.clock(), 0

    def got(self, n: int) -> None:
        """`n` more bytes arrived; raises when the window that just ended was too slow."""
        self.count += n
        now = self.clock()
        if now - self.since < self.window:
            return
        if self.count < self.rate * (now - self.since):
            from inspector.remote import errors as err

            raise err.timed_out(
                self.url, f"the answer came slower than {self.rate:g} bytes a second", self.window,
                f"{LOW_SPEED[0]} (or lower {LOW_SPEED_TIME[0]})",
            )
        self.since, self.count = now, 0


def inflight() -> int:
    """Requests in flight per store (ZI_REMOTE_INFLIGHT, or its older name ZI_S3_INFLIGHT; 1..64, default 8)."""
    name = "ZI_REMOTE_INFLIGHT" if "ZI_REMOTE_INFLIGHT" in os.environ else "ZI_S3_INFLIGHT"
    return int_env(name, 8, 1, 64)
