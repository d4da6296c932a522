"""One bucket's client, listings and request accounting, shared by every source and handle on it.

boto3 (the `s3` extra) is imported on first use, with the endpoint, region and credentials from the standard
AWS environment (AWS_ENDPOINT_URL, AWS_REGION, AWS_PROFILE, ...) and standard-mode retries with backoff for
throttling; every botocore failure becomes a user error (`remote.errors`). A listing is one folder level under
the one name rule, sizes bounded, kept a few seconds.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypeVar

from inspector.errors import CorruptFileError
from inspector.parse.names import name_problem
from inspector.remote.errors import missing_client, store_error
from inspector.system.units import printable as shown

T = TypeVar("T")
SCHEME = "s3://"
MAX_OBJECT_BYTES = 1 << 46  # 64 TiB: above any store's object limit (S3: 50 TB); a larger size is a lie
LISTING_TTL_S = 10.0
MAX_LISTING = 200_000  # objects in one folder; a rank folder of a 100k-GPU run holds ~200k files


def int_env(name: str, default: int, low: int, high: int) -> int:
    try:
        return min(high, max(low, int(os.environ.get(name, default))))
    except ValueError:
        return default


def inflight() -> int:
    """Requests in flight per store (ZI_S3_INFLIGHT, 1..64, default 8)."""
    return int_env("ZI_S3_INFLIGHT", 8, 1, 64)


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
                    retries={"max_attempts": int_env("AWS_MAX_ATTEMPTS", 6, 1, 20), "mode": "standard"},
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
        return self._request(url, fn, kwargs, writing=False)

    def call_write(self, url: str, fn: Callable[..., T], **kwargs: Any) -> T:
        """`call` for a request of an output upload, whose refusals read differently (permissions to write,
        a conditional write refused)."""
        return self._request(url, fn, kwargs, writing=True)

    def _request(self, url: str, fn: Callable[..., T], kwargs: dict[str, Any], *, writing: bool) -> T:
        from botocore.exceptions import BotoCoreError, ClientError

        with self._lock:
            self.requests += 1
        try:
            return fn(**kwargs)
        except (BotoCoreError, ClientError) as exc:
            raise store_error(exc, url, writing=writing) from None

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

    def keys_below(self, prefix: str, url: str) -> dict[str, int]:
        """Every key below `prefix`, at any depth, with its size (at most MAX_LISTING: a bound, not a view of
        the bucket; an output's conditional writes cover what it misses)."""
        found: dict[str, int] = {}
        kwargs: dict[str, Any] = {"Bucket": self.bucket, "Prefix": prefix}
        while True:
            page = self.call_write(url, self.client().list_objects_v2, **kwargs)
            for obj in page.get("Contents") or ():
                key, size = obj.get("Key"), obj.get("Size")
                if isinstance(key, str) and isinstance(size, int) and not isinstance(size, bool):
                    found[key] = size
            token = page.get("NextContinuationToken")
            if len(found) > MAX_LISTING or not page.get("IsTruncated") or not isinstance(token, str):
                return found
            kwargs["ContinuationToken"] = token

    def open_uploads(self, prefix: str, url: str) -> list[tuple[str, str]]:
        """(key, UploadId) of the multipart uploads in progress below `prefix` (bounded as `keys_below`)."""
        out: list[tuple[str, str]] = []
        kwargs: dict[str, Any] = {"Bucket": self.bucket, "Prefix": prefix}
        while True:
            page = self.call_write(url, self.client().list_multipart_uploads, **kwargs)
            for up in page.get("Uploads") or ():
                key, uid = up.get("Key"), up.get("UploadId")
                if isinstance(key, str) and isinstance(uid, str):
                    out.append((key, uid))
            if not page.get("IsTruncated") or len(out) > MAX_LISTING:
                return out
            kwargs |= {
                "KeyMarker": page.get("NextKeyMarker"),
                "UploadIdMarker": page.get("NextUploadIdMarker"),
            }


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
