"""A stage-3 parameter's slices over the ranks as one small record, computed from the partition rule.

Under ZeRO-3 rank r holds elements [r·p, (r+1)·p) of every parameter, p = ceil(numel/ws), at the parameter's
offset inside the rank's flat tensor (FORMAT.md §3.4). Kept as one `Segment` per parameter, rank and copy
(master, exp_avg, exp_avg_sq), a 4,096-rank save of 42 parameters was half a million records (~38 MiB). Here
each rank's flat tensor is listed once per sub-group and copy (`RankStarts`), and a parameter's slices are
one `RankSlices` over it: a `Sequence[Segment]` every consumer reads as the tuple it stands for.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterator, Sequence
from typing import Any

from inspector.format.dtypes import itemsize
from inspector.scan.model import Segment, SegmentRecords


class RankStarts:
    """Each rank's flat tensor of one sub-group and copy: its file and the byte offset of its element 0."""

    __slots__ = ("dtype", "files", "itemsize", "offsets")

    def __init__(self, files: Sequence[str], offsets: Sequence[int], dtype: str) -> None:
        if len(files) != len(offsets):
            raise ValueError("one offset per rank file")
        self.files = tuple(files)
        self.offsets = array("q", offsets)  # 8 bytes a rank, not a Python int object each
        self.dtype = dtype
        self.itemsize = itemsize(dtype)

    def __len__(self) -> int:
        return len(self.files)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, RankStarts) and (self.files, self.offsets, self.dtype) == (
            other.files,
            other.offsets,
            other.dtype,
        )

    def __hash__(self) -> int:
        return hash((self.files, self.dtype))

    def __reduce__(self) -> tuple[Any, ...]:
        return (RankStarts, (self.files, self.offsets.tolist(), self.dtype))


class RankSlices(SegmentRecords):
    """Elements [0, numel) of one parameter: rank r's `part` elements (fewer on the last) at element `off` of
    its flat tensor in `starts`; ranks past the parameter's end hold only padding and give no segment."""

    __slots__ = ("numel", "off", "part", "starts")

    def __init__(self, starts: RankStarts, off: int, numel: int, part: int) -> None:
        self.starts, self.off, self.numel, self.part = starts, off, numel, part

    def __len__(self) -> int:
        if self.numel <= 0 or self.part <= 0:
            return 0
        return min(len(self.starts), -(-self.numel // self.part))

    def _at(self, r: int) -> Segment:
        s = self.starts
        take = min(self.part, self.numel - r * self.part)
        return Segment(s.files[r], s.offsets[r] + self.off * s.itemsize, take, s.dtype)

    def __iter__(self) -> Iterator[Segment]:
        for r in range(len(self)):
            yield self._at(r)

    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, slice):
            return tuple(self._at(r) for r in range(len(self))[i])
        n = len(self)
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError(i)
        return self._at(i)

    def __repr__(self) -> str:
        return f"RankSlices({len(self):,} ranks, {self.numel:,} elements)"

    def __reduce__(self) -> tuple[Any, ...]:
        return (RankSlices, (self.starts, self.off, self.numel, self.part))


def segments_nbytes(segments: Sequence[Segment]) -> int:
    """Bytes a tensor's segments hold: a `RankSlices`' from its element count, no segment made."""
    if isinstance(segments, RankSlices):
        return min(segments.numel, len(segments) * segments.part) * segments.starts.itemsize if len(segments) else 0
    return sum(s.nbytes for s in segments)


def segments_files(segments: Sequence[Segment]) -> Iterator[str]:
    """The files a tensor's segments read (repeats possible): a `RankSlices`' from its rank table."""
    if isinstance(segments, RankSlices):
        return iter(segments.starts.files[: len(segments)])
    return (s.file for s in segments)
