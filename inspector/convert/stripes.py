"""Stage-3 parameters whose per-rank slices are small, read a window of every rank's flat tensor at a time.

Under ZeRO-3 each parameter is a slice of every rank's flat tensor (`scan.slices.RankSlices`), so a chunk
of one parameter is one read a rank. A model with many small parameters saved by many ranks (1,024 ranks x
1,262 parameters: 1.3 M reads of ~15 elements) spent its time on those calls, not its bytes. Parameters
that follow each other in the output are also neighbours in the ranks' flat tensors (both are in module
order), so a run of them is read as one window of each rank's flat tensor, one read a rank, into one pool
buffer laid out as rows (`Stripe`), then each parameter is gathered from the rows in two numpy copies.

A rank's read starts at its first slice of the run and ends after its last (`Window.begins`, `.ends`): the
bytes between are those of one flat tensor, which the scan proved holds every slice (a sub-group's storage
covers [0, its length) on every rank). Nothing outside a rank's own slices is read, so a rank that holds only
a short tail reads no further than the path through segments would.

The buffer is a source buffer of the pools (the plan's one budget): rows take all of it when the dtype
changes (cast into the output buffer as rows, gathered back into the source buffer, written from there), half
when it does not (gathered into the other half). A run keeps to one (source, output) dtype pair, and a
window spans at most DENSE times the elements its parameters take, so an unusual order (names sorted
against the module order) never reads much that it does not use: it only shortens the runs.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Hashable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

import numpy as np

from inspector.convert.plan import ConversionPlan, PlannedShard, PlannedTensor
from inspector.convert.reader import add_reads
from inspector.format.dtypes import itemsize
from inspector.scan.model import Segment
from inspector.scan.slices import RankSlices, RankStarts

SMALL_SLICE = 64 << 10  # bytes of one rank's slice below which a parameter is read in a stripe
DENSE = 2  # a window spans at most this many times the elements its parameters take from it


@dataclass
class Window:
    """The rows of one rank table (`RankStarts`) a stripe reads: rank r's elements [begins[r], ends[r]) of its
    flat tensor (its slices of the run and what lies between them) at column begins[r] - first of row r,
    for the ranks r < len(ends), at element `at` of the stripe's rows, `width` elements a row."""

    starts: RankStarts
    first: int
    width: int
    begins: np.ndarray[Any, Any]  # int64, one a rank that holds a slice of the run
    ends: np.ndarray[Any, Any]
    used: int  # elements the run's parameters take from these rows
    at: int = 0

    @property
    def elems(self) -> int:
        return len(self.ends) * self.width


class Member(Protocol):
    """What a stripe groups: convert's planned tensors, health's jobs (anything with a size)."""

    @property
    def numel(self) -> int: ...


M = TypeVar("M", bound=Member)


@dataclass
class Stripe(Generic[M]):
    """A run of consecutive members (output tensors, health's streams) read as windows (`Window`) of the
    ranks' flat tensors."""

    tensors: list[M]
    windows: list[Window]

    @property
    def rows(self) -> int:
        return sum(w.elems for w in self.windows)

    @property
    def numel(self) -> int:
        return sum(t.numel for t in self.tensors)


def small_slices(s: object, dtype: str | None = None) -> RankSlices | None:
    """`s` (a tensor's segments) where it is a stage-3 parameter's slices small enough for a stripe (in
    `dtype`, where one is given), else None."""
    if not isinstance(s, RankSlices) or not len(s) or s.part * s.starts.itemsize >= SMALL_SLICE:
        return None
    return s if dtype is None or s.starts.dtype == dtype else None


def small(t: PlannedTensor) -> bool:
    """Whether `t` is read in a stripe: a stage-3 parameter whose slices are small, in its slices' dtype."""
    return small_slices(t.segments, t.src_dtype) is not None


def capacity(shard: PlannedShard, limit: int, t: PlannedTensor) -> int:
    """Row elements a stripe of `t`'s dtypes holds in one source buffer (see the module docstring)."""
    size = shard.buffer_size(limit)
    if t.src_dtype != t.out_dtype:
        return size // max(itemsize(t.src_dtype), itemsize(t.out_dtype))
    return size // 2 // itemsize(t.src_dtype)


def _ends(s: RankSlices) -> np.ndarray[Any, Any]:
    """The element (in the rank's flat tensor) after rank r's slice of `s`, for each rank that holds one."""
    r = np.arange(len(s), dtype=np.int64)
    return s.off + np.minimum(s.part, s.numel - r * s.part)


_NONE = np.iinfo(np.int64).max  # a rank's begin before it holds a slice of the run


def _grown(w: Window | None, s: RankSlices) -> Window:
    """`w` (None: a new window) taking `s` too."""
    ends = _ends(s)
    begins = np.full(len(ends), s.off, dtype=np.int64)
    if w is not None:
        if (more := len(w.ends) - len(ends)) > 0:  # (np.pad costs ~30 µs a call: thousands of members)
            ends = np.concatenate([ends, np.zeros(more, np.int64)])
            begins = np.concatenate([begins, np.full(more, _NONE, np.int64)])
        ends[: len(w.ends)] = np.maximum(ends[: len(w.ends)], w.ends)
        begins[: len(w.begins)] = np.minimum(begins[: len(w.begins)], w.begins)
    first = int(begins.min())
    return Window(s.starts, first, int(ends.max()) - first, begins, ends, s.numel + (w.used if w else 0))


def _slices(t: PlannedTensor) -> RankSlices:
    s = t.segments
    assert isinstance(s, RankSlices)
    return s


def _window_of(windows: list[Window], s: RankSlices) -> int | None:
    """The index of the window over `s`'s rank table, or None."""
    return next((i for i, w in enumerate(windows) if w.starts is s.starts or w.starts == s.starts), None)


def _joined(windows: list[Window], s: RankSlices) -> list[Window] | None:
    """`windows` once `s` joins them, or None where a window would grow too sparse or be read backwards."""
    windows = list(windows)
    i = _window_of(windows, s)
    if i is None:
        return [*windows, _grown(None, s)]
    if s.off < windows[i].first:  # read backwards: not module order, a run of its own
        return None
    windows[i] = g = _grown(windows[i], s)
    return windows if g.elems <= DENSE * g.used else None


def _joined_all(windows: list[Window], parts: Iterable[RankSlices]) -> list[Window] | None:
    for s in parts:
        got = _joined(windows, s)
        if got is None:
            return None
        windows = got
    return windows


def grouped(
    members: Iterable[M],
    parts: Callable[[M], tuple[RankSlices, ...] | None],
    key: Callable[[M], Hashable],
    cap: Callable[[M], int],
) -> Iterator[M | Stripe[M]]:
    """The members in order, runs of consecutive ones grouped into stripes: `parts` names the slices a
    member reads (None: read on its own), members of one stripe share `key`, and a stripe's rows stay
    within `cap` (its first member's) elements. A member over the cap alone is yielded on its own."""
    st: Stripe[M] | None = None
    k: Hashable = None
    limit = 0
    for t in members:
        ps = parts(t)
        if ps is None:
            if st is not None:
                yield _laid_out(st)
                st = None
            yield t
            continue
        if st is not None and key(t) == k:
            windows = _joined_all(st.windows, ps)
            if windows is not None and sum(w.elems for w in windows) <= limit:
                st.tensors.append(t)
                st.windows = windows
                continue
        if st is not None:
            yield _laid_out(st)
            st = None
        first = _joined_all([], ps)
        k, limit = key(t), cap(t)
        if first is None or sum(w.elems for w in first) > limit:  # over the buffer: read on its own
            yield t
            continue
        st = Stripe([t], first)
    if st is not None:
        yield _laid_out(st)


def runs(shard: PlannedShard, limit: int) -> Iterator[PlannedTensor | Stripe[PlannedTensor]]:
    """The shard's tensors in order, consecutive small stage-3 parameters of one (source, output) dtype
    pair grouped into stripes."""
    return grouped(
        shard.tensors,
        lambda t: (_slices(t),) if small(t) else None,
        lambda t: (t.src_dtype, t.out_dtype),
        lambda t: capacity(shard, limit, t),
    )


def _laid_out(st: Stripe[M]) -> Stripe[M]:
    at = 0
    for w in st.windows:
        w.at = at
        at += w.elems
    return st


def stripe_reads(st: Stripe[Any]) -> list[tuple[str, int, int, int]]:
    """(file, byte offset, row byte, bytes) of each rank's one read of a stripe."""
    out = []
    for w in st.windows:
        size = w.starts.itemsize
        files, offsets = w.starts.files, w.starts.offsets
        for r, (b, e) in enumerate(zip(w.begins.tolist(), w.ends.tolist(), strict=True)):
            out.append((files[r], offsets[r] + b * size, (w.at + r * w.width + b - w.first) * size, (e - b) * size))
    return out


def fill_gaps(st: Stripe[Any], raw: np.ndarray[Any, Any]) -> None:
    """Zero the row bytes no read fills (before a rank's first slice of the run, after its last), so a cast
    never sees stale bytes."""
    for w in st.windows:
        size = w.starts.itemsize
        for r in np.flatnonzero((w.begins > w.first) | (w.ends - w.first < w.width)).tolist():
            row = (w.at + r * w.width) * size
            raw[row : row + (int(w.begins[r]) - w.first) * size] = 0
            raw[row + (int(w.ends[r]) - w.first) * size : row + w.width * size] = 0


def gather(st: Stripe[PlannedTensor], rows: np.ndarray[Any, Any], dst: np.ndarray[Any, Any]) -> None:
    """Each tensor's elements, rank by rank, from the stripe's `rows` (flat, in the rows' layout) to `dst`
    back to back (both typed arrays of one dtype)."""
    k = 0
    for t in st.tensors:
        gather_one(st, rows, _slices(t), dst[k : k + t.numel])
        k += t.numel


def gather_one(st: Stripe[Any], rows: np.ndarray[Any, Any], s: RankSlices, dst: np.ndarray[Any, Any]) -> None:
    """The elements of one member's slices `s`, rank by rank, from the stripe's `rows` into `dst` (its
    length: `s.numel`)."""
    gather_range(st, rows, s, 0, s.numel, dst)


def gather_range(
    st: Stripe[Any], rows: np.ndarray[Any, Any], s: RankSlices, start: int, count: int, dst: np.ndarray[Any, Any]
) -> None:
    """Elements [start, start + count) of the slices `s` from the stripe's `rows` into `dst`: a partial rank's
    row, a block of whole ones, a partial one (at most three copies)."""
    i = _window_of(st.windows, s)
    assert i is not None  # every slices of a stripe has its window
    w = st.windows[i]
    grid = rows[w.at : w.at + w.elems].reshape(len(w.ends), w.width)
    rel, part = s.off - w.first, s.part
    pos, end, k = start, start + count, 0
    while pos < end:
        r, c = divmod(pos, part)
        if c == 0 and end - pos >= part:
            full = (end - pos) // part
            dst[k : k + full * part].reshape(full, part)[...] = grid[r : r + full, rel : rel + part]
            take = full * part
        else:
            take = min(part - c, end - pos)
            dst[k : k + take] = grid[r, rel + c : rel + c + take]
        k += take
        pos += take


def stripe_counts(st: Stripe[Any]) -> tuple[Counter[str], int]:
    """(bytes read from each file, how many reads) of one stripe: one read a rank and window."""
    by_file: Counter[str] = Counter()
    count = 0
    for w in st.windows:
        count += len(w.ends)
        for f, n in zip(w.starts.files, ((w.ends - w.begins) * w.starts.itemsize).tolist(), strict=False):
            by_file[f] += n
    return by_file, count


def plan_reads(plan: ConversionPlan, limit: int) -> tuple[Counter[str], int]:
    """(bytes read from each file, how many reads) of the whole plan as the pipeline reads it with chunks
    of `limit` elements (`reads_counted`). Preflight's time model charges each read."""
    units = (x for shard in plan.shards for x in runs(shard, limit))
    return reads_counted(units, lambda t: (t.segments,))


def reads_counted(
    units: Iterable[M | Stripe[M]], streams: Callable[[M], Iterable[Sequence[Segment]]]
) -> tuple[Counter[str], int]:
    """(bytes read from each file, how many reads) of members read alone or in stripes: a stripe one read a
    rank and window (the bytes between its slices too), a member each of its `streams` as
    `reader.add_reads` counts it (a stage-3 parameter one read a rank)."""
    by_file: Counter[str] = Counter()
    count = 0
    for u in units:
        if isinstance(u, Stripe):
            got, n = stripe_counts(u)
            by_file.update(got)
            count += n
        else:
            for segs in streams(u):
                count += add_reads(segs, by_file)
    return by_file, count
