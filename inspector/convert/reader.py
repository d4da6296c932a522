"""Positioned reads of exactly the bytes a tensor needs, into caller-owned buffers.

Files are opened through the confined byte source (regular files inside the checkpoint's folder or bucket
prefix only): locally O_RDONLY and read with `os.preadv`, remotely by ranged GETs. A checkpoint is never
modified, nothing is mapped into our address space (RSS stays honest), and threads share one handle.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from inspector.errors import CorruptFileError
from inspector.format.dtypes import bits_dtype, itemsize, numpy_dtype
from inspector.format.torchzip import TensorRef
from inspector.format.zstditem import ZstdItem, open_item, parse_item_path
from inspector.scan.model import Checkpoint, Runs, Segment
from inspector.system.bytesource import ByteSource, Handle, any_remote, open_handle_in
from inspector.system.residency import resident_fraction
from inspector.text import shown

if TYPE_CHECKING:
    from inspector.remote.ranged import RangedHandle


COLD_FILES = 4  # files whose residency says whether a run reads from the disk (those it reads most of)
COLD_SAMPLES = 16  # `mincore` windows of each


def open_cap() -> int:
    """How many local files a pool keeps open at once: a quarter of the process's descriptor limit (the
    output, sockets and other pools need the rest), whatever the rank count; a 4,096-rank ZeRO-3 save has
    8,192 files and a common `ulimit -n` is 1,024."""
    try:
        import resource

        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    except (ImportError, OSError, ValueError):
        return 256
    if soft == getattr(resource, "RLIM_INFINITY", -1) or soft <= 0:
        return 4096
    return max(16, soft // 4)


class FilePool:
    """Open handles shared by reader threads (positioned reads need no seek, so no locking per read).

    Every file is opened through one of `sources` (the checkpoint's folder or bucket prefix, a base model's
    folder): a path that leads out of them is refused, as scan refuses it. A local handle is a descriptor
    read with `preadv`; a remote one fetches ranges, several in flight (`inspector.system.bytesource`).
    At most `cap` local files stay open (`open_cap`): the least recently used one no read is using is closed
    to make room, and opened again when it is needed again."""

    def __init__(self, *sources: ByteSource, cap: int | None = None) -> None:
        self._sources = sources
        self._handles: dict[str, Handle] = {}
        self._local: dict[str, None] = {}  # the local files among them, least recently used first
        self._users: dict[str, int] = {}  # reads in flight per path: such a handle is never closed
        self._pinned: set[str] = set()  # files under an open zstd item: its handle holds theirs
        self._cap = cap if cap is not None else open_cap()
        self._lock = threading.Lock()

    @property
    def remote(self) -> bool:
        """Whether any source is on an object store (reads there are round trips worth overlapping)."""
        return any_remote(self._sources)

    def handle(self, path: str) -> Handle:
        """The open handle of `path`. It stays open until the pool needs its room: use it at once, or hold
        it with `using` while another thread may open files."""
        with self._lock:
            handle = self._handles.get(path)
            if handle is not None:
                if path in self._local:
                    self._local[path] = self._local.pop(path)  # most recently used now
                return handle
        item = parse_item_path(path)  # a zstd DCP item: its decompressed bytes, over its file's handle
        if item:
            with self._lock:
                self._pinned.add(item[0])
        inner = self.handle(item[0]) if item else None
        with self._lock:
            handle = self._handles.get(path)
            if handle is None:
                # as scan opens it: a regular file or a clear refusal, never a hang on a FIFO that
                # was swapped in after the scan
                handle = open_item(path, self._sources, inner) if item else open_handle_in(path, self._sources)
                self._handles[path] = handle
                if handle.fileno() is not None and not item:
                    self._local[path] = None
                    self._make_room()
        return handle

    def _make_room(self) -> None:
        """Close least recently used local files no read is using, down to the cap (under the lock)."""
        over = len(self._local) - self._cap
        for path in list(self._local) if over > 0 else ():
            if over <= 0:
                break
            if self._users.get(path) or path in self._pinned:
                continue  # a read is using it, or an open zstd item reads through it
            del self._local[path]
            self._handles.pop(path).close()
            over -= 1

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
            handle = self._handles.get(path)
            if handle is not None and path in self._local:
                self._local[path] = self._local.pop(path)  # most recently used now
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

    @property
    def open_count(self) -> int:
        """Handles open now (at most the cap, plus those reads are using)."""
        return len(self._handles)

    def __enter__(self) -> FilePool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _short(path: str, end: int) -> CorruptFileError:
    return CorruptFileError(
        f"{shown(path)}: the file ends before byte {end}; it is truncated.",
        hint="Copy the checkpoint again from its source.",
    )


def bytes_by_file(segments: Iterable[Segment]) -> Counter[str]:
    """Bytes a run reads from each file (path -> bytes), for residency and preflight's calibration."""
    return reads_of(segments)[0]


def add_reads(segments: Sequence[Segment], by_file: Counter[str]) -> int:
    """Add one tensor's bytes to `by_file`; returns its reads (`reads_of`). A stage-3 parameter's
    `RankSlices` from its rank table, one read a rank, no segment made (thousands of ranks)."""
    from inspector.scan.slices import RankSlices

    if not isinstance(segments, RankSlices):
        got, n = reads_of(segments)
        by_file.update(got)
        return n
    n = len(segments)
    if n:
        files, size = segments.starts.files, segments.starts.itemsize
        for f in files[: n - 1]:
            by_file[f] += segments.part * size
        by_file[files[n - 1]] += (segments.numel - (n - 1) * segments.part) * size
    return n


def reads_of(segments: Iterable[Segment]) -> tuple[Counter[str], int]:
    """(bytes read from each file, how many reads): segments adjacent in one file are one read, as
    `read_segments_into` merges them. Preflight's time model charges each read (a call and its Python
    bookkeeping, `calibrate.RANGE_COST`): a stage-3 parameter is one read a rank."""
    reads: Counter[str] = Counter()
    ranges, last, end = 0, "", -1
    for seg in segments:
        n = seg.nbytes
        reads[seg.file] += n
        if seg.file != last or seg.offset != end:
            ranges += 1
        last, end = seg.file, seg.offset + n
    return reads, ranges


_RUNS_AT_ONCE = 4096  # runs listed before they are read (a store reads them together, several in flight)


def byte_view(a: np.ndarray[Any, Any]) -> memoryview:
    """A writable byte memoryview over a contiguous array (bf16 and fp8 arrays included)."""
    return a.reshape(-1).view(np.uint8).data


PAGE = 4096


def buffer(nbytes: int) -> np.ndarray[Any, Any]:
    """A raw byte buffer that reads land in, starting on a page (numpy, not bytearray: typed views of it need
    no copy). The kernel's copy from the page cache (`rep movsb`) runs 2.5-6.5x slower when the buffer lies
    4-16 bytes past the source within a page (results.md, "a page-cache read's speed depends on where its
    buffer sits"), and numpy starts large buffers 16 bytes into a page: every record torch saved on a page
    boundary (1 in 64: records are 64-byte aligned) was read at ~5.8 GB/s instead of ~14. From a page, a
    64-byte aligned source is never in that band. The slack page is never touched (RSS does not grow)."""
    raw = np.empty(nbytes + PAGE, dtype=np.uint8)
    start = -raw.ctypes.data % PAGE
    return raw[start : start + nbytes]


def empty(numel: int, dtype: np.dtype[Any] | type) -> np.ndarray[Any, Any]:
    """`np.empty(numel, dtype)` in a `buffer`: an array a read fills."""
    dt = np.dtype(dtype)
    return buffer(numel * dt.itemsize).view(dt)


class Window(Sequence[Segment]):
    """Elements [skip, skip + numel) of a `Runs` from its segment `first` on, cut into segments as they are
    walked: a chunk of a join of a million rows is one small object, not a list of its rows."""

    __slots__ = ("first", "numel", "runs", "skip")

    def __init__(self, runs: Runs, first: int, skip: int, numel: int) -> None:
        self.runs, self.first, self.skip, self.numel = runs, first, skip, numel

    def __iter__(self) -> Iterator[Segment]:
        left, skip = self.numel, self.skip
        for seg in self.runs.iter_from(self.first):
            take = min(seg.numel - skip, left)
            if take > 0:
                yield Segment(seg.file, seg.offset + skip * itemsize(seg.dtype), take, seg.dtype)
            left, skip = left - max(take, 0), 0
            if not left:
                return

    def __len__(self) -> int:
        return sum(1 for _ in self)

    def __getitem__(self, i: Any) -> Any:
        return tuple(self)[i]


def _windows(runs: Runs, chunk_elems: int) -> Iterator[Window]:
    """`iter_chunks` of a `Runs`: each chunk a `Window`, the segments walked once, none kept."""
    first, skip, room = 0, 0, chunk_elems
    for i, seg in enumerate(runs):
        at = 0
        while seg.numel - at >= room:  # a chunk ends in (or at the end of) this segment
            yield Window(runs, first, skip, chunk_elems)
            at += room
            first, skip = (i + 1, 0) if at == seg.numel else (i, at)
            room = chunk_elems
        room -= seg.numel - at
    if room < chunk_elems:
        yield Window(runs, first, skip, chunk_elems - room)


def iter_chunks(segments: Sequence[Segment], chunk_elems: int) -> Iterator[Sequence[Segment]]:
    """Cut a tensor's segments into pieces of at most `chunk_elems` elements, in order."""
    if isinstance(segments, Runs):
        yield from _windows(segments, chunk_elems)
        return
    batch: list[Segment] = []
    room = chunk_elems
    for seg in segments:
        off, left = seg.offset, seg.numel
        size = itemsize(seg.dtype)
        while left:
            take = min(left, room)
            batch.append(Segment(seg.file, off, take, seg.dtype))
            off += take * size
            left -= take
            room -= take
            if room == 0:
                yield batch
                batch, room = [], chunk_elems
    if batch:
        yield batch


def read_segments_into(pool: FilePool, segments: Iterable[Segment], out: np.ndarray[Any, Any]) -> int:
    """Read segments back to back into the flat array `out`; returns bytes read."""
    view = byte_view(out)
    runs: list[tuple[str, int, memoryview]] = []
    pos = 0
    for seg in segments:  # segments adjacent in one file are read as one run (one GET on a store)
        n = seg.nbytes
        if runs and runs[-1][0] == seg.file and runs[-1][1] + len(runs[-1][2]) == seg.offset:
            path, offset, _ = runs[-1]
            runs[-1] = (path, offset, view[pos - (seg.offset - offset) : pos + n])
        else:
            if len(runs) >= _RUNS_AT_ONCE:  # a chunk of a million rows: read in batches, never all listed
                pool.read_runs(runs)
                runs.clear()
            runs.append((seg.file, seg.offset, view[pos : pos + n]))
        pos += n
    pool.read_runs(runs)
    return pos


def read_bits(pool: FilePool, segments: Sequence[Segment], dtype: str) -> np.ndarray[Any, Any]:
    """The segments back to back in their stored dtype, bf16 as its bits (`bits_dtype`: no ml_dtypes import,
    ~0.9 CPU-s, for code that only widens or compares them)."""
    out = empty(sum(s.numel for s in segments), bits_dtype(dtype))
    read_segments_into(pool, segments, out)
    return out


def read_segments(pool: FilePool, segments: Sequence[Segment], dtype: str) -> np.ndarray[Any, Any]:
    out = empty(sum(s.numel for s in segments), numpy_dtype(dtype))
    read_segments_into(pool, segments, out)
    return out


def read_tensor(
    ckpt: Checkpoint, name: str, state: str = "fp32", pool: FilePool | None = None
) -> np.ndarray[Any, Any]:
    """A whole tensor in its source dtype (fp32 master for trainable params). For tests and small tensors."""
    info = ckpt.tensor(name)
    segments = info.segments if state == "fp32" else dict(info.moments)[state]
    dtype = segments[0].dtype if segments else info.dtype
    own = pool is None
    pool = pool or FilePool(ckpt.source)
    try:
        return read_segments(pool, segments, dtype).reshape(info.shape)
    finally:
        if own:
            pool.close()


def read_ref(ref: TensorRef) -> np.ndarray[Any, Any]:
    """Materialise a small TensorRef (step counters, buffers) honouring its strides."""
    segs = [Segment(ref.path, off, n, ref.dtype) for off, n in ref.runs()]
    with FilePool() as pool:
        return read_segments(pool, segs, ref.dtype).reshape(ref.shape)
