"""A checkpoint under an `s3://bucket/prefix`, read as a confined byte source: listings and ranged GETs.

The same boundary as a local folder: every name a listing returns passes the one name rule (`..`, a
separator, control characters and over-long names are dropped, so they can never become a path or reach the
terminal); a path that leaves the prefix is refused; a size a listing declares is bounded before anything
trusts it; object content is never shown. The client is boto3 (the `s3` extra), imported on first use, with
the endpoint, region and credentials from the standard AWS environment (AWS_ENDPOINT_URL, AWS_PROFILE, ...),
standard-mode retries with backoff for throttling, and every botocore failure turned into a user error.
"""

from __future__ import annotations

import os
import re
import stat
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, TypeVar

from inspector.errors import CorruptFileError, InspectorError, NotACheckpointError
from inspector.parse.names import name_problem
from inspector.remote.errors import missing_client, store_error
from inspector.system.source import not_regular, os_error, outside, parse_json
from inspector.system.units import printable as shown

T = TypeVar("T")
SCHEME = "s3://"
MAX_OBJECT_BYTES = 1 << 46  # 64 TiB: above any store's object limit (S3: 50 TB); a larger size is a lie
LISTING_TTL_S = 10.0
MAX_LISTING = 200_000  # objects in one folder; a rank folder of a 100k-GPU run holds ~200k files
_BUCKET = re.compile(r"[a-z0-9][a-z0-9.\-_]{1,61}[a-z0-9]")


def _int_env(name: str, default: int, low: int, high: int) -> int:
    try:
        return min(high, max(low, int(os.environ.get(name, default))))
    except ValueError:
        return default


def inflight() -> int:
    """Requests in flight per store (ZI_S3_INFLIGHT, 1..64, default 8)."""
    return _int_env("ZI_S3_INFLIGHT", 8, 1, 64)


def split_url(url: str) -> tuple[str, list[str]]:
    """(bucket, key components) of an `s3://` URL; a component that is not a plain name is refused."""
    rest = url[len(SCHEME) :].rstrip("/")
    bucket, _, key = rest.partition("/")
    if not _BUCKET.fullmatch(bucket):
        raise NotACheckpointError(
            f"{shown(url)}: {shown(bucket)!s} is not a valid bucket name.",
            hint="An S3 URL reads s3://bucket/prefix/to/checkpoint.",
        )
    parts = key.split("/") if key else []
    if any(name_problem(p) for p in parts):
        raise NotACheckpointError(
            f"{shown(url)} is not a plain object path: `.`, `..`, empty segments and control characters are "
            "not followed in a URL.",
            hint="Write the prefix as the store lists it, e.g. s3://bucket/run/global_step100.",
            title="Unsafe URL",
        )
    return bucket, parts


def normalise_url(url: str) -> str:
    bucket, parts = split_url(url)
    return "/".join([f"{SCHEME}{bucket}", *parts])


@dataclass(frozen=True)
class ObjectInfo:
    size: int  # -1: the store declared a size no object can have
    mtime_ns: int
    etag: str


@dataclass(frozen=True)
class Listing:
    """One folder level of a prefix: its objects and its sub-prefixes, names already checked."""

    files: dict[str, ObjectInfo]
    dirs: frozenset[str]


class S3Store:
    """One bucket: a client, the listings read so far (a scan asks about the same folders many times), the
    ranged-read block cache and the pool of reader threads. Counts requests and bytes."""

    def __init__(self, bucket: str) -> None:
        from inspector.remote.ranged import BlockCache

        self.bucket = bucket
        self.cache = BlockCache()
        self.requests = 0
        self.fetched = 0
        self._client: Any = None
        self._pool: ThreadPoolExecutor | None = None
        self.slots = threading.BoundedSemaphore(inflight())  # GETs in flight, however many threads ask
        self._lock = threading.Lock()
        self._listings: dict[str, tuple[float, Listing]] = {}

    def client(self) -> Any:
        with self._lock:
            if self._client is None:
                try:
                    import boto3
                    from botocore.config import Config
                except ImportError:
                    raise missing_client() from None
                session = boto3.session.Session()
                config = Config(
                    retries={"max_attempts": _int_env("AWS_MAX_ATTEMPTS", 6, 1, 20), "mode": "standard"},
                    connect_timeout=10,
                    read_timeout=60,
                    max_pool_connections=2 * inflight() + 2,
                    user_agent_extra="zero-inspector",
                )
                self._client = session.client(
                    "s3", region_name=session.region_name or "us-east-1", config=config
                )
            return self._client

    def pool(self) -> ThreadPoolExecutor:
        with self._lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(inflight(), thread_name_prefix="zi-s3")
            return self._pool

    def call(self, url: str, fn: Callable[..., T], **kwargs: Any) -> T:
        """One client call; any botocore failure becomes a user error naming `url`, never a traceback."""
        from botocore.exceptions import BotoCoreError, ClientError

        with self._lock:
            self.requests += 1
        try:
            return fn(**kwargs)
        except (BotoCoreError, ClientError) as exc:
            raise store_error(exc, url) from None

    def count(self, nbytes: int) -> None:
        with self._lock:
            self.fetched += nbytes

    def listing(self, prefix: str) -> Listing:
        """The folder `prefix` ("" or ending in "/"); names that break the rule are dropped. Kept for
        LISTING_TTL_S: a scan asks about the same folders dozens of times within a second, while a long-lived
        process (the app) must still see a tag saved later."""
        cached = self._listings.get(prefix)
        if cached is not None and time.monotonic() - cached[0] < LISTING_TTL_S:
            return cached[1]
        url = f"{SCHEME}{self.bucket}/{prefix}"
        files: dict[str, ObjectInfo] = {}
        dirs: set[str] = set()
        token: str | None = None
        while True:
            kwargs: dict[str, Any] = {"Bucket": self.bucket, "Prefix": prefix, "Delimiter": "/"}
            if token:
                kwargs["ContinuationToken"] = token
            page = self.call(url, self.client().list_objects_v2, **kwargs)
            for cp in page.get("CommonPrefixes") or ():
                name = _below(cp.get("Prefix"), prefix, "/")
                if name is not None:
                    dirs.add(name)
            for obj in page.get("Contents") or ():
                name = _below(obj.get("Key"), prefix, "")
                if name is not None:
                    files[name] = _info(obj)
            if len(files) + len(dirs) > MAX_LISTING:
                raise CorruptFileError(
                    f"{shown(url)} holds more than {MAX_LISTING:,} objects; it is not a checkpoint folder.",
                    hint="Point at the checkpoint's own prefix.",
                )
            token = page.get("NextContinuationToken")
            if not page.get("IsTruncated") or not isinstance(token, str) or not token:
                break
        found = Listing(files, frozenset(dirs))
        with self._lock:
            self._listings[prefix] = (time.monotonic(), found)
        return found


def _below(key: Any, prefix: str, suffix: str) -> str | None:
    """The name of `key` one level below `prefix`, or None when it is no plain name (never shown)."""
    if not isinstance(key, str) or not key.startswith(prefix) or not key.endswith(suffix):
        return None
    name = key[len(prefix) : len(key) - len(suffix)]
    return None if name_problem(name) else name


def _info(obj: dict[str, Any]) -> ObjectInfo:
    size = obj.get("Size")
    if not isinstance(size, int) or isinstance(size, bool) or not 0 <= size <= MAX_OBJECT_BYTES:
        size = -1
    when = obj.get("LastModified")
    mtime = int(when.timestamp() * 1e9) if isinstance(when, datetime) else 0
    etag = obj.get("ETag")
    return ObjectInfo(size, mtime, etag if isinstance(etag, str) and len(etag) < 200 else "")


_STORES: dict[tuple[str | None, ...], S3Store] = {}
_STORES_LOCK = threading.Lock()


def store_for(bucket: str) -> S3Store:
    """The process's store for a bucket under the current endpoint and identity."""
    env = os.environ
    key = (
        bucket,
        env.get("AWS_ENDPOINT_URL"),
        env.get("AWS_ENDPOINT_URL_S3"),
        env.get("AWS_ACCESS_KEY_ID"),
        env.get("AWS_PROFILE"),
    )
    with _STORES_LOCK:
        if key not in _STORES:
            _STORES[key] = S3Store(bucket)
        return _STORES[key]


@dataclass(frozen=True)
class S3Source:
    """A bucket prefix the tool reads from, with the same questions and answers as a local `Source`."""

    root: str
    label: str = field(default="folder", compare=False)

    @classmethod
    def at(cls, url: str, label: str = "folder") -> S3Source:
        return cls(normalise_url(url), label)

    @classmethod
    def for_path(cls, url: str) -> S3Source:
        """The whole bucket of `url`: for tree questions that need no tighter root."""
        return cls(f"{SCHEME}{split_url(url)[0]}")

    @property
    def store(self) -> S3Store:
        return store_for(split_url(self.root)[0])

    def join(self, path: str, *names: str) -> str:
        return "/".join([path.rstrip("/"), *names])

    def resolve(self, path: str | os.PathLike[str]) -> str:
        raw = os.fspath(path)
        full = raw if raw.startswith(SCHEME) else self.join(self.root, raw)
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
        try:
            self.resolve(path)
        except InspectorError:
            return False
        return True

    def _entry(self, url: str) -> tuple[str, ObjectInfo | None]:
        _, parts = split_url(url)
        store = self.store
        if not parts:
            store.listing("")  # the bucket must exist and be readable
            return "dir", None
        listing = store.listing("".join(p + "/" for p in parts[:-1]))
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
        _, parts = split_url(url)
        listing = self.store.listing("".join(p + "/" for p in parts))
        return sorted({*listing.files, *listing.dirs})

    def stat(self, path: str) -> tuple[int, int]:
        """(size, mtime in ns) of an object; OSError when there is none."""
        kind, info = self._entry(self.resolve(path))
        if kind != "file" or info is None:
            raise FileNotFoundError(path)
        return info.size, info.mtime_ns

    def open_handle(self, path: str | os.PathLike[str]) -> Any:
        from inspector.remote.ranged import S3Handle

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
        _, parts = split_url(url)
        return S3Handle(self.store, url, "/".join(parts), info.size, info.etag)

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
