"""One bucket as the tool sees it, whatever the store: checked listings, accounting, in-flight slots.

A `Store` wraps one backend (`remote.backend`) and does, once for every kind of store, what must not be left
to a client: every listed name passes the one name rule (a key with `..`, a separator or control characters
is dropped, never shown), every declared size is bounded, a folder with more entries than any checkpoint
has is refused, listings are kept a few seconds (a scan asks about the same folders dozens of times), and
requests and bytes are counted. Its slots bound the ranged reads in flight however many threads ask
(ZI_REMOTE_INFLIGHT), and its pool and block cache serve `remote.ranged`.
"""

from __future__ import annotations

import importlib
import os
import threading
import time
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from inspector.errors import CorruptFileError
from inspector.parse.names import name_problem
from inspector.remote.backend import MAX_LISTING, Backend, RawObject, inflight, scheme_row
from inspector.text import shown

MAX_OBJECT_BYTES = 1 << 46  # 64 TiB: above any store's object limit (S3: 50 TB); a larger size is a lie
LISTING_TTL_S = 10.0
MAX_ETAG = 200
CACHE_BLOCKS = 64  # of remote.ranged.BLOCK (64 KiB): the scan's small reads, 4 MiB per bucket
# the environment a store's client reads: a change of endpoint or identity is another store
_IDENTITY = ("AWS_", "GOOGLE_", "AZURE_", "AZURITE_", "FSSPEC_", "HF_", "STORAGE_EMULATOR_HOST", "ZI_S3_CLIENT")


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


class Store:
    """One bucket: its backend, the listings read so far, the ranged-read block cache and the pool of reader
    threads. Counts requests and bytes."""

    def __init__(self, scheme: str, bucket: str) -> None:
        self.scheme = scheme
        self.bucket = bucket
        self.backend: Backend = backend_for(scheme, bucket)
        self.cache: BlockCache = BlockCache()
        self.requests = 0
        self.fetched = 0
        self._pool: ThreadPoolExecutor | None = None
        self.slots = threading.BoundedSemaphore(inflight())  # reads in flight, however many threads ask
        self._lock = threading.Lock()
        self._listings: dict[str, tuple[float, Listing]] = {}

    def url(self, key: str) -> str:
        return f"{self.scheme}://{self.bucket}/{key}"

    def pool(self) -> ThreadPoolExecutor:
        with self._lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(inflight(), thread_name_prefix=f"zi-{self.scheme}")
            return self._pool

    def count(self, requests: int = 0, nbytes: int = 0) -> None:
        with self._lock:
            self.requests += requests
            self.fetched += nbytes

    def listing(self, prefix: str) -> Listing:
        """The folder `prefix` ("" or ending in "/"); names that break the rule are dropped. Kept for
        LISTING_TTL_S: a scan asks about the same folders dozens of times within a second, while a long-lived
        process (the app) must still see a tag saved later."""
        cached = self._listings.get(prefix)
        if cached is not None and time.monotonic() - cached[0] < LISTING_TTL_S:
            return cached[1]
        files: dict[str, ObjectInfo] = {}
        dirs: set[str] = set()
        for page in self.backend.list(prefix):
            self.count(requests=1)
            for key in page.dirs:
                name = _below(key, prefix, dir=True)
                if name is not None:
                    dirs.add(name)
            for obj in page.objects:
                name = _below(obj.key, prefix, dir=False)
                if name is not None:
                    files[name] = _info(obj)
            if len(files) + len(dirs) > MAX_LISTING:
                raise CorruptFileError(
                    f"{shown(self.url(prefix))} holds more than {MAX_LISTING:,} objects; it is not a "
                    "checkpoint folder.",
                    hint="Point at the checkpoint's own prefix.",
                )
        found = Listing(files, frozenset(dirs))
        with self._lock:
            self._listings[prefix] = (time.monotonic(), found)
        return found


def _below(key: object, prefix: str, dir: bool) -> str | None:
    """The name of `key` one level below `prefix`, or None when it is no plain name (never shown)."""
    if not isinstance(key, str) or not key.startswith(prefix):
        return None
    name = key[len(prefix) :]
    if dir and name.endswith("/"):
        name = name[:-1]
    return None if name_problem(name) else name


def _info(obj: RawObject) -> ObjectInfo:
    size = obj.size
    if not isinstance(size, int) or isinstance(size, bool) or not 0 <= size <= MAX_OBJECT_BYTES:
        size = -1
    mtime = obj.mtime_ns if isinstance(obj.mtime_ns, int) and not isinstance(obj.mtime_ns, bool) else 0
    etag = obj.etag if isinstance(obj.etag, str) and len(obj.etag) < MAX_ETAG else ""
    return ObjectInfo(size, mtime, etag)


_STORES: dict[tuple[str, ...], Store] = {}
_STORES_LOCK = threading.Lock()


def store_for(scheme: str, bucket: str) -> Store:
    """The process's store for a bucket under the current endpoint and identity (the environment its client
    reads); the client's package is imported here, on first use."""
    env = tuple(sorted(f"{k}={v}" for k, v in os.environ.items() if k.startswith(_IDENTITY)))
    key = (scheme, bucket, *env)
    with _STORES_LOCK:
        if key not in _STORES:
            _STORES[key] = Store(scheme, bucket)
        return _STORES[key]


class BlockCache:
    """Fixed-size blocks of objects, least recently used dropped first; bounded in bytes."""

    def __init__(self, blocks: int = CACHE_BLOCKS) -> None:
        self._blocks: OrderedDict[tuple[str, str, int], bytes] = OrderedDict()
        self._limit = blocks
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._blocks)

    def get(self, key: tuple[str, str, int]) -> bytes | None:
        with self._lock:
            data = self._blocks.get(key)
            if data is not None:
                self._blocks.move_to_end(key)
            return data

    def put(self, key: tuple[str, str, int], data: bytes) -> None:
        with self._lock:
            self._blocks[key] = data
            self._blocks.move_to_end(key)
            while len(self._blocks) > self._limit:
                self._blocks.popitem(last=False)


def backend_for(scheme: str, bucket: str) -> Backend:
    """The client for one bucket, from the scheme table (`remote.backend.SCHEMES`); its package is imported
    now (a missing one is a user error naming the extra)."""
    module, _, name = scheme_row(scheme).backend.partition(":")
    cls = getattr(importlib.import_module(module), name)
    backend: Backend = cls(scheme, bucket)
    return backend
