"""Checks a model-parallel scan makes on tensor data it would otherwise never read: copies of one tensor
that different ranks keep (a pipeline's tied weight on every stage that uses it) must hold the same bytes.

Reads are bounded: tensors up to `_FULL` bytes are compared whole; larger ones in `_BLOCKS` evenly spaced
blocks of `_BLOCK` bytes (first and last included), so a scan stays quick on a billion-element embedding.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from inspector.errors import CorruptFileError
from inspector.format.dtypes import itemsize
from inspector.scan.model import Segment, TensorInfo
from inspector.system.bytesource import ByteSource, Handle, open_handle_in

_FULL = 64 << 20
_BLOCK = 1 << 20
_BLOCKS = 16
_OPEN = 64  # files a CopyChecks keeps open at once, whatever the rank count


def _spans(nbytes: int) -> list[tuple[int, int]]:
    """(start, length) byte spans of the tensor to compare."""
    if nbytes <= _FULL:
        return [(o, min(_BLOCK, nbytes - o)) for o in range(0, nbytes, _BLOCK)]
    step = (nbytes - _BLOCK) // (_BLOCKS - 1)
    return [(i * step, _BLOCK) for i in range(_BLOCKS)]


class CopyChecks:
    """One scan's reads of tensor data for these checks: each file opened once and kept (at most `_OPEN` at a
    time, the least recently read closed first) until `close`, so a layout that compares hundreds of
    replicated norms, or proves every master's copy, opens each rank file once, not twice a tensor. Use as a
    context manager around the scan's checks."""

    def __init__(self, source: ByteSource) -> None:
        self.source = source
        self._handles: dict[str, Handle] = {}

    def __enter__(self) -> CopyChecks:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        handles, self._handles = self._handles, {}
        for h in handles.values():
            h.close()

    def _handle(self, path: str) -> Handle:
        h = self._handles.pop(path, None)  # taken out and put back last: the order is recency
        if h is None:
            if len(self._handles) >= _OPEN:
                self._handles.pop(next(iter(self._handles))).close()
            h = open_handle_in(path, (self.source,))
        self._handles[path] = h
        return h

    def _read(self, segs: Sequence[Segment], start: int, length: int) -> bytes:
        """Bytes [start, start+length) of the tensor the segments make up."""
        out = bytearray()
        pos = 0
        for seg in segs:
            n = seg.nbytes
            lo, hi = max(start, pos), min(start + length, pos + n)
            if lo < hi:
                raw = self._handle(seg.file).pread(hi - lo, seg.offset + lo - pos)
                if len(raw) != hi - lo:
                    raise CorruptFileError(f"{seg.file}: the file ends inside a tensor; it is truncated.")
                out += raw
            pos += n
        return bytes(out)

    def differ(self, a: TensorInfo, b: TensorInfo) -> bool:
        """Whether two copies of one tensor differ (shape, dtype or bytes). An unreadable copy counts as
        differing: the scan cannot vouch for it."""
        if a.shape != b.shape or a.dtype != b.dtype:
            return True
        nbytes = a.numel * itemsize(a.dtype)
        try:
            return any(self._read(a.segments, s, n) != self._read(b.segments, s, n) for s, n in _spans(nbytes))
        except (OSError, CorruptFileError):
            return True

    def not_cast(self, master: TensorInfo, copy: Sequence[Segment]) -> bool:
        """Whether a 16-bit module copy is NOT the fp32 master cast to its dtype (round to nearest even), on
        the first and last `_SAMPLE` elements. An optimizer that copies masters into the module after every
        step (ZeRO off) leaves them equal, so this proves a master was matched to the right name without a
        name in the file; two same-shaped parameters swapped differ here. NaNs compare equal to NaNs.
        Unreadable: True."""
        import numpy as np

        if not copy or copy[0].dtype not in ("bfloat16", "float16") or master.dtype != "float32":
            return True
        if sum(s.numel for s in copy) != master.numel:
            return True
        bf16 = copy[0].dtype == "bfloat16"
        n = master.numel
        spans = [(0, min(n, _SAMPLE))] + ([(n - _SAMPLE, _SAMPLE)] if n > 2 * _SAMPLE else [])
        if _SAMPLE < n <= 2 * _SAMPLE:
            spans = [(0, n)]
        try:
            for start, count in spans:
                m = np.frombuffer(self._read(master.segments, start * 4, count * 4), np.float32)
                c = np.frombuffer(self._read(copy, start * 2, count * 2), np.uint16)
                if bf16:  # rounded on the bits, as torch rounds: no ml_dtypes import (~0.7 CPU-s) for a scan
                    cast, c_nan = _round_bf16(m), (c & 0x7FFF) > 0x7F80
                else:
                    cast, c_nan = m.astype(np.float16).view(np.uint16), np.isnan(c.view(np.float16))
                same = np.where(np.isnan(m), c_nan, cast == c)  # a NaN master: any NaN copy
                if not bool(same.all()):
                    return True
            return False
        except (OSError, CorruptFileError, ValueError):
            return True


_SAMPLE = 4096  # elements compared at each end of a tensor by `CopyChecks.not_cast`


def _round_bf16(m: Any) -> Any:
    """fp32 -> bf16 bits, round to nearest even (what torch's cast does to every value but NaN)."""
    import numpy as np

    u = m.view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
