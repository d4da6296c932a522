"""Universal files of small stage-3 parameters read from stripes that the writing workers share.

Each state of each parameter is a file of its own, and under ZeRO-3 each is a slice of every rank's flat
tensor: a model with many small parameters saved by many ranks made one read a rank per file (the
126-layer demo at 1,024 ranks: 3.9 M reads of ~15 elements, 61 s). Consecutive files of one state are
neighbours in the ranks' flat tensors, so they are grouped into stripes (`convert/stripes.py`); the first
worker that needs a stripe reads every rank's window of it once, and each file's elements are gathered
from those rows chunk by chunk as its writer asks for them.

The workers take the files in order, so a stripe's files are written at about the same time: a stripe's
rows are dropped once each of its files has been written, and at most `live` stripes are kept (the least
recently used one goes first; a file that needs it again has it read again), whatever a resumed or split
(`--part`) run skips. Rows are bounded by `cap_elems`, so the stripes kept cost at most STRIPE_BUDGET beside
the workers' chunk buffers (a worker still gathering from a stripe just dropped holds it a moment longer).
From a cold page cache a stripe's windows, and the next stripe's, are asked of the kernel as it is read:
the disk reads every rank's window at once, not one after another.
"""

from __future__ import annotations

import threading
from collections import Counter, OrderedDict
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from inspector.convert.kinds.universal.plan import UniFile
from inspector.convert.reader import buffer
from inspector.convert.stripes import Stripe, fill_gaps, grouped, reads_counted, small_slices, stripe_reads
from inspector.format.dtypes import bits_dtype, itemsize
from inspector.scan.slices import RankSlices

STRIPE_BUDGET = 16 << 20  # bytes of every stripe's rows kept at once, whatever the worker count


def live(workers: int) -> int:
    """Stripes kept at once: one a worker's file in flight, and two more (a file skipped by a resumed or
    split run leaves its stripe unfinished until the least recently used one goes)."""
    return max(1, workers) + 2


def cap_elems(workers: int) -> int:
    """Row elements of one stripe: the budget shared by the stripes kept at once (4 bytes an element, the
    widest source)."""
    return STRIPE_BUDGET // live(workers) // 4


class _Member:
    """A file in a stripe (what `grouped` groups: anything with a size)."""

    __slots__ = ("file", "index")

    def __init__(self, index: int, file: UniFile) -> None:
        self.index, self.file = index, file

    @property
    def numel(self) -> int:
        s = self.file.segments
        return s.numel if isinstance(s, RankSlices) else 0


def _parts(m: _Member) -> tuple[RankSlices, ...] | None:
    s = small_slices(m.file.segments, m.file.source_dtype)
    return (s,) if s is not None else None


class _Rows:
    """One stripe's rows, read once (under `lock`) by the first worker that needs them."""

    __slots__ = ("data", "left", "lock")

    def __init__(self, members: int) -> None:
        self.lock = threading.Lock()
        self.data: np.ndarray[Any, Any] | None = None
        self.left = members  # files not yet written


def any_striped(files: Sequence[UniFile]) -> bool:
    """Whether some file is read from a stripe (preflight then counts STRIPE_BUDGET)."""
    return any(_parts(_Member(i, f)) is not None for i, f in enumerate(files))


def stripes_of(files: Sequence[UniFile], cap: int) -> Iterator[_Member | Stripe[_Member]]:
    """The files in order (by index), consecutive small stage-3 ones of one dtype grouped into stripes of at
    most `cap` row elements."""
    return grouped((_Member(i, f) for i, f in enumerate(files)), _parts, _dtype, lambda m: cap)


def _dtype(m: _Member) -> str:
    return m.file.source_dtype


def universal_reads(files: Sequence[UniFile], workers: int) -> tuple[Counter[str], int]:
    """(bytes read from each file, how many reads) of the export's tensor files on `workers`
    (`stripes.reads_counted`). Preflight's time model charges each read."""
    return SharedRows(None, files, workers).reads()


class SharedRows:
    """The plan's stripes and the rows of those being written (see the module docstring)."""

    def __init__(self, pool: Any, files: Sequence[UniFile], workers: int) -> None:
        self._pool = pool
        self._of: dict[int, Stripe[_Member]] = {}
        self._order: dict[int, int] = {}  # a stripe (by id) -> its place among them
        self._stripes: list[Stripe[_Member]] = []
        self._units = list(stripes_of(files, cap_elems(workers)))
        for unit in self._units:
            if isinstance(unit, Stripe):
                self._order[id(unit)] = len(self._stripes)
                self._stripes.append(unit)
                for m in unit.tensors:
                    self._of[m.index] = unit
        self.ahead = False  # from a cold page cache: a stripe's windows and the next's asked of the kernel
        self._advised = -1  # the last stripe asked for
        self._live: OrderedDict[int, _Rows] = OrderedDict()
        self._max = live(workers)
        self._lock = threading.Lock()

    def reads(self) -> tuple[Counter[str], int]:
        """`universal_reads` of these files, from the stripes already grouped."""
        return reads_counted(self._units, lambda m: (m.file.segments,))

    def stripe(self, index: int) -> Stripe[_Member] | None:
        """The stripe file `index` is read from, or None where it is read segment by segment."""
        return self._of.get(index)

    def rows(self, index: int) -> np.ndarray[Any, Any]:
        """The rows of file `index`'s stripe in its source dtype's bits, read now if no worker has."""
        st = self._of[index]
        key = id(st)
        with self._lock:
            entry = self._live.get(key)
            if entry is None:
                entry = self._live[key] = _Rows(len(st.tensors))
                while len(self._live) > self._max:
                    self._live.popitem(last=False)
            else:
                self._live.move_to_end(key)
        with entry.lock:
            if entry.data is None:
                if self.ahead:
                    self._advise(self._order[key] + 1)
                dtype = st.tensors[0].file.source_dtype
                raw = buffer(st.rows * itemsize(dtype))
                view = memoryview(raw)  # type: ignore[arg-type]  # numpy arrays are buffers
                self._pool.read_runs([(f, off, view[at : at + n]) for f, off, at, n in stripe_reads(st)])
                fill_gaps(st, raw)
                entry.data = raw.view(bits_dtype(dtype))
            return entry.data

    def _advise(self, upto: int) -> None:
        """Ask the kernel for the windows of the stripes up to `upto` not yet asked for: the disk reads
        every rank's window at once, and the next stripe's while this one is written."""
        with self._lock:
            first, self._advised = self._advised + 1, max(self._advised, min(upto, len(self._stripes) - 1))
            todo = self._stripes[first : self._advised + 1]
        for st in todo:
            for f, off, _, n in stripe_reads(st):
                self._pool.advise(f, off, n)

    def written(self, index: int) -> None:
        """File `index` is written: its stripe's rows go once every file of it is."""
        key = id(self._of[index])
        with self._lock:
            entry = self._live.get(key)
            if entry is not None:
                entry.left -= 1
                if entry.left <= 0:
                    del self._live[key]
