"""Ranged GETs into caller-owned buffers: several in flight, small reads through a bounded block cache.

A scan makes many tiny reads (zip local headers of 30 bytes, pickles of a few KiB); each would be a round
trip, so they go through 64 KiB blocks kept in a small LRU (4 MiB per bucket, whatever the checkpoint): a
neighbouring read is then free, and a lone one costs 64 KiB, not the object.
A convert reads large runs (a tensor chunk, adjacent segments already merged by the caller); those bypass
the cache and are cut into parts fetched in parallel straight into the caller's buffer, so memory stays the
pipeline's fixed pools. Every answer is checked: exactly the bytes asked for, from an object of the size
listed and the same ETag (where the store's client can carry one), or a clear error. The same for every
store: only the backend's one call (`remote.backend`) differs.
"""

from __future__ import annotations

import time
from concurrent.futures import Future

from inspector.remote.backend import inflight
from inspector.remote.errors import truncated
from inspector.remote.store import Store

BLOCK = 64 << 10
SMALL = 32 << 10  # reads up to this size go through the block cache
MIN_PART = 2 << 20  # a large read is cut into parts of at least this: 30 ms of latency per request
# costs less than the transfer of 2 MiB at 100 MB/s (with 512 KiB parts 8 in flight read 2.5x one, with 2 MiB 3.4x)
_STREAM_TRIES = 3  # clients retry a request that fails; a body that breaks off midway is ours to retry


class RangedHandle:
    """One object opened for reading on any store: its listed size and ETag, read by range. Thread-safe."""

    def __init__(self, store: Store, url: str, key: str, size: int, etag: str) -> None:
        self.store = store
        self.path = url
        self.key = key
        self.size = size
        self.etag = etag

    def pread(self, n: int, offset: int) -> bytes:
        n = max(0, min(n, self.size - offset))
        if n == 0:
            return b""
        if n <= SMALL:
            return self._cached(offset, n)
        buf = bytearray(n)
        fetch_many([(self, offset, memoryview(buf))])
        return bytes(buf)

    def read_into(self, offset: int, view: memoryview) -> int:
        n = max(0, min(len(view), self.size - offset))
        if n:
            fetch_many([(self, offset, view[:n])])
        return n

    def fileno(self) -> int | None:
        return None

    def close(self) -> None:
        """Nothing to release: the connections belong to the store."""

    def _cached(self, offset: int, n: int) -> bytes:
        first, last = offset // BLOCK, (offset + n - 1) // BLOCK
        blocks = {i: self.store.cache.get((self.key, self.etag, i)) for i in range(first, last + 1)}
        missing = [i for i, b in blocks.items() if b is None]
        if missing:  # one GET for the missing blocks, first to last (at most a few, since n <= SMALL)
            lo, hi = missing[0] * BLOCK, min(self.size, (missing[-1] + 1) * BLOCK)
            buf = bytearray(hi - lo)
            get_range(self, lo, memoryview(buf))
            for i in range(missing[0], missing[-1] + 1):
                block = bytes(buf[(i - missing[0]) * BLOCK : (i - missing[0] + 1) * BLOCK])
                self.store.cache.put((self.key, self.etag, i), block)
                blocks[i] = block
        data = b"".join(blocks[i] or b"" for i in range(first, last + 1))
        start = offset - first * BLOCK
        return data[start : start + n]


def get_range(handle: RangedHandle, start: int, view: memoryview) -> None:
    """Fill `view` with the object's bytes from `start`, exactly; a short or oversized answer is refused.
    Holds one of the store's slots while the request is open, so ZI_REMOTE_INFLIGHT bounds what is in
    flight. Clients retry a request that fails; a body that breaks off midway is retried here."""
    store = handle.store
    n = len(view)
    if start < 0 or start + n > handle.size:
        raise truncated(
            handle.path, f"a read of {n} bytes at {start} lies past the listed size {handle.size}"
        )
    for attempt in range(_STREAM_TRIES):
        with store.slots:
            store.count(requests=1)
            broken = store.backend.get_range(handle.key, start, view, handle.size, handle.etag)
        if broken is None:
            store.count(nbytes=n)
            return
        if attempt == _STREAM_TRIES - 1:
            raise broken
        time.sleep(0.2 * 2**attempt)


def fetch_many(reads: list[tuple[RangedHandle, int, memoryview]]) -> None:
    """Fill every (handle, offset, view), each cut into parts, up to the store's limit in flight at once."""
    width = inflight()
    parts: list[tuple[RangedHandle, int, memoryview]] = []
    for handle, offset, view in reads:
        n = len(view)
        size = max(MIN_PART, -(-n // width))
        parts += [(handle, offset + p, view[p : p + size]) for p in range(0, n, size)]
    if len(parts) == 1:
        get_range(*parts[0])
        return
    pool = parts[0][0].store.pool()  # one pool per process would do as well; the first store's is at hand
    futures: list[Future[None]] = [pool.submit(get_range, *p) for p in parts]
    errors = [exc for f in futures if (exc := f.exception()) is not None]
    if errors:
        raise errors[0]
