"""The files a run reads, open and shared by its reader threads: at most a few hundred descriptors whatever
the rank count (`open_cap`), each read holding its file's handle so no other thread closes it for room.

Files are opened through the confined byte source (regular files inside the checkpoint's folder or bucket
prefix only): locally O_RDONLY and read with `os.preadv`, remotely by ranged GETs.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, cast

from inspector.errors import CorruptFileError
from inspector.format.zstditem import ZstdItem, open_item, parse_item_path
from inspector.system.bytesource import ByteSource, Handle, any_remote, open_handle_in
from inspector.system.descriptors import descriptor_limit
from inspector.system.residency import resident_fraction
from inspector.text import shown

if TYPE_CHECKING:
    from inspector.remote.ranged import RangedHandle


MANY_RUNS = 64  # a batch of local runs this long (a stripe's: a run a rank) is read by one thread at a time.
# Each read is a microsecond in the kernel and releases the GIL around it: two threads' read loops handed the
# GIL back and forth at every read (health of the 20M demo at 1,024 ranks, 105 K reads: 1.18 s on 2 workers
# against 1.00 on 1). A thread waiting here sleeps, or reduces what it read, without the GIL.
COLD_FILES = 4  # files whose residency says whether a run reads from the disk (those it reads most of)
COLD_SAMPLES = 16  # `mincore` windows of each


def open_cap(share: int = 2) -> int:
    """How many local files a pool keeps open at once, whatever the rank count: by default half the
    process's descriptor limit (the output files, sockets, kept folders and the scan need the rest; a run
    reads through one pool at a time, the shards it writes side by side sharing theirs: `SharedPool`); a
    pool open beside a run's (the app's one-tensor statistics beside its health pass) takes a smaller
    `share`. A 4,096-rank ZeRO-3 save has 8,192 files and a common soft `ulimit -n` is 1,024 (the command
    line raises it toward the hard limit at start: `system/descriptors.py`)."""
    soft = descriptor_limit()
    return 256 // share if soft is None else max(16, soft // share)


class FilePool:
    """Open handles shared by reader threads (positioned reads need no seek, so no locking per read).

    Every file is opened through one of `sources` (the checkpoint's folder or bucket prefix, a base model's
    folder): a path that leads out of them is refused, as scan refuses it. A local handle is a descriptor
    read with `preadv`; a remote one fetches ranges, several in flight (`inspector.system.bytesource`).
    At most `cap` local files stay open (`open_cap`): the most recently used one no read is using is closed
    to make room (`_make_room` says why), and opened again when it is needed again. From its first open to
    `close`, a pool is a batch of reads (`Source.keeping`): its local folders' descriptors are kept, so a
    file costs one `openat`, not a walk from the root (7 % of a convert's worker samples at 1,024 ranks by
    py-spy; its CPU did not move)."""

    def __init__(self, *sources: ByteSource, cap: int | None = None) -> None:
        self._sources = sources
        self._handles: dict[str, Handle] = {}
        self._local: dict[str, None] = {}  # the local files among them, least recently used first
        self._users: dict[str, int] = {}  # reads in flight per path: such a handle is never closed
        self._pinned: set[str] = set()  # files under an open zstd item: its handle holds theirs
        self._cap = cap if cap is not None else open_cap()
        self._lock = threading.Lock()
        self._alone = threading.Lock()  # held by one thread's batch of many local runs (MANY_RUNS)
        self._batch: contextlib.ExitStack | None = None  # the sources' `keeping` blocks, from the first open

    @property
    def remote(self) -> bool:
        """Whether any source is on an object store (reads there are round trips worth overlapping)."""
        return any_remote(self._sources)

    def handle(self, path: str) -> Handle:
        """The open handle of `path`. It stays open until the pool needs its room: use it at once, or hold
        it with `using` while another thread may open files."""
        with self._lock:
            handle = self._open_now(path)
        if handle is not None:
            return handle
        item = parse_item_path(path)  # a zstd DCP item: its decompressed bytes, over its file's handle
        if item:
            with self._lock:
                self._pinned.add(item[0])
        inner = self.handle(item[0]) if item else None
        with self._lock:
            handle = self._handles.get(path)
            if handle is None:
                if self._batch is None:
                    self._batch = _keeping(self._sources)
                # as scan opens it: a regular file or a clear refusal, never a hang on a FIFO that
                # was swapped in after the scan
                handle = open_item(path, self._sources, inner) if item else open_handle_in(path, self._sources)
                self._handles[path] = handle
                if handle.fileno() is not None and not item:
                    self._local[path] = None
                    self._make_room(path)
        return handle

    def _open_now(self, path: str) -> Handle | None:
        """`path`'s handle if it is open, made the most recently used (under the lock)."""
        handle = self._handles.get(path)
        if handle is not None and path in self._local:
            self._local[path] = self._local.pop(path)
        return handle

    def _make_room(self, opened: str) -> None:
        """Close local files no read is using, down to the cap (under the lock): the most recently used
        first, never `opened` (the file that needs the room). A pool is over its cap only where a run reads
        more files than it holds, and such a run reads them in sweeps (a stripe reads every rank's file):
        closing the least recently used file closes each one just before the next sweep asks for it, every
        open a miss; closing the most recent keeps the others open for the next sweep (cap - 1 hits)."""
        over = len(self._local) - self._cap
        if over <= 0:
            return
        closing: list[str] = []
        for path in reversed(self._local):
            if path == opened or self._users.get(path) or path in self._pinned:
                continue  # the one opening, one a read is using, or one an open zstd item reads through
            closing.append(path)
            if len(closing) == over:
                break
        for path in closing:
            del self._local[path]
            self._handles.pop(path).close()

    @contextlib.contextmanager
    def using(self, path: str) -> Iterator[Handle]:
        """The handle of `path`, kept open while the block runs (another thread may be opening files)."""
        handle = self._hold(path)
        try:
            yield handle
        finally:
            self._release(path)

    def _hold(self, path: str) -> Handle:
        """`path`'s handle, counted in use (never closed for room) until `_release`: an open one under one
        lock round trip, as every chunk's read asks (a generator context manager and a second lock per
        read were 13 us of a health pass's ~240 a MiB chunk)."""
        with self._lock:
            self._users[path] = self._users.get(path, 0) + 1
            handle = self._open_now(path)
        if handle is not None:
            return handle
        try:
            return self.handle(path)
        except BaseException:
            self._release(path)
            raise

    def _release(self, path: str) -> None:
        with self._lock:
            left = self._users[path] - 1
            if left:
                self._users[path] = left
            else:
                del self._users[path]

    def fd(self, path: str) -> int | None:
        """The file's local descriptor (for kernel copies), or None when it is a remote object; valid until
        the pool next opens a file: hold it with `using` where other threads read."""
        return self.handle(path).fileno()

    def read_into(self, path: str, offset: int, view: memoryview) -> None:
        """Fill `view` from `path` at `offset`, or raise a clear error if the file is shorter."""
        handle = self._hold(path)
        try:
            got = handle.read_into(offset, view)
        finally:
            self._release(path)
        if got < len(view):
            raise _short(path, offset + len(view))

    def advise(self, path: str, offset: int, nbytes: int) -> None:
        """Ask the kernel to start reading `nbytes` of `path` at `offset` into the page cache now
        (`POSIX_FADV_WILLNEED`: the I/O is queued, nothing is copied to us, RSS does not grow), so that a
        cold read later finds it there. Advice only: a remote object, a platform without it, or a refusal
        changes nothing."""
        if not hasattr(os, "posix_fadvise"):
            return
        with self.using(path) as handle:
            fd = handle.fileno()
            if fd is None:
                return
            with contextlib.suppress(OSError):
                os.posix_fadvise(fd, offset, nbytes, os.POSIX_FADV_WILLNEED)

    def mostly_cold(self, by_file: Mapping[str, int]) -> bool:
        """Whether most of the bytes a run reads (`by_file`: path -> bytes) are not in the page cache, judged on
        the COLD_FILES files it reads most of (`mincore` over COLD_SAMPLES windows each: a millisecond or
        two whatever the checkpoint). False from an object store, or where residency cannot be told: read
        advice (`advise`) pays only for bytes the disk must still serve, and costs on cached ones."""
        if self.remote:
            return False
        largest = sorted(by_file.items(), key=lambda kv: -kv[1])[:COLD_FILES]
        cached = total = 0.0
        for path, nbytes in largest:
            with self.using(path) as handle:
                fd = handle.fileno()
                share = resident_fraction(fd, COLD_SAMPLES) if fd is not None else None
            if share is None:
                return False
            cached += nbytes * share
            total += nbytes
        return bool(total) and cached / total < 0.5

    def read_runs(self, runs: Sequence[tuple[str, int, memoryview]]) -> None:
        """Fill every (path, offset, view): local runs one by one, runs on an object store together, several
        requests in flight (a stage-3 chunk has a run in every rank's file)."""
        if len(runs) >= MANY_RUNS and not self.remote:
            with self._alone:
                self._read_runs(runs)
        else:
            self._read_runs(runs)

    def _read_runs(self, runs: Sequence[tuple[str, int, memoryview]]) -> None:
        remote: list[tuple[RangedHandle, int, memoryview]] = []
        for path, offset, view in runs:
            if len(runs) == 1 or path in self._local:  # one run, or an open local file: read it now
                self.read_into(path, offset, view)
                continue
            handle = self.handle(path)  # a remote handle holds no descriptor and is never closed for room
            if handle.fileno() is not None or isinstance(handle, ZstdItem):
                self.read_into(path, offset, view)
            elif offset + len(view) > handle.size:
                raise _short(path, offset + len(view))
            else:
                remote.append((cast("RangedHandle", handle), offset, view))
        if remote:
            from inspector.remote.ranged import fetch_many

            fetch_many(remote)

    def close(self) -> None:
        with self._lock:
            for handle in self._handles.values():
                handle.close()
            self._handles.clear()
            self._local.clear()
            self._pinned.clear()
            batch, self._batch = self._batch, None
        if batch is not None:
            batch.close()  # the folders' descriptors closed with the last batch of their source

    @property
    def open_count(self) -> int:
        """Handles open now (at most the cap, plus those reads are using)."""
        return len(self._handles)

    def __enter__(self) -> FilePool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class SharedPool:
    """One `FilePool` for the shards of a plan written side by side: they read the same rank files, so one
    set of descriptors serves them all and a process holds one big pool at a time (`open_cap`'s half). Made
    by the first shard in flight, closed when the last one in flight ends."""

    def __init__(self, *sources: ByteSource) -> None:
        self._sources = sources
        self._lock = threading.Lock()
        self._pool: FilePool | None = None
        self._users = 0

    def enter(self) -> FilePool:
        """The pool, for a shard starting; `leave` when it ends."""
        with self._lock:
            if self._pool is None:
                self._pool = FilePool(*self._sources)
            self._users += 1
            return self._pool

    def leave(self) -> None:
        with self._lock:
            self._users -= 1
            pool = self._pool if self._users == 0 else None
            if pool is not None:
                self._pool = None
        if pool is not None:
            pool.close()


def _keeping(sources: Sequence[ByteSource]) -> contextlib.ExitStack:
    """Every local source's `keeping` block entered (a store's sources have none)."""
    stack = contextlib.ExitStack()
    for source in sources:
        keeping = getattr(source, "keeping", None)
        if keeping is not None:
            stack.enter_context(keeping())
    return stack


def _short(path: str, end: int) -> CorruptFileError:
    return CorruptFileError(
        f"{shown(path)}: the file ends before byte {end}; it is truncated.",
        hint="Copy the checkpoint again from its source.",
    )
