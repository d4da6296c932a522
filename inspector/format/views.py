"""Tensor views as a pickle describes them (`StorageRef`, `TensorRef`: where a tensor's bytes are) and the
checks every view passes before a byte is read: the records the restricted unpickler (`torchzip`) builds,
apart from the unpickler that walks the pickle."""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, fields
from types import MappingProxyType
from typing import Any

from inspector.format.dtypes import ITEMSIZE, itemsize


@dataclass(frozen=True, slots=True)
class StorageRef:
    """A storage record in an archive: where its bytes start and how many there are."""

    path: str
    key: str
    dtype: str
    offset: int
    nbytes: int


@dataclass(frozen=True, slots=True)
class TensorRef:
    """A tensor as a view onto a storage record; no data is loaded."""

    storage: StorageRef
    storage_offset: int
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    dtype: str
    attrs: Mapping[str, Any] = field(default_factory=dict, compare=False, hash=False)  # read-only

    @property
    def path(self) -> str:
        return self.storage.path

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def itemsize(self) -> int:
        return itemsize(self.dtype)

    @property
    def nbytes(self) -> int:
        return self.numel * self.itemsize

    @property
    def offset(self) -> int:
        """Absolute byte offset of element 0 in the file."""
        return self.storage.offset + self.storage_offset * self.itemsize

    def is_contiguous(self) -> bool:
        expected = 1
        for d, s in zip(reversed(self.shape), reversed(self.stride), strict=True):
            if d != 1 and s != expected:
                return False
            expected *= d
        return True

    def extent_bytes(self) -> int:
        """Bytes from the storage start to the end of the last element this view touches."""
        if self.numel == 0:
            return 0
        last = self.storage_offset + sum((d - 1) * s for d, s in zip(self.shape, self.stride, strict=True))
        return (last + 1) * self.itemsize

    def runs(self) -> Iterator[tuple[int, int]]:
        """Contiguous (absolute byte offset, element count) runs in row-major order."""
        if self.numel == 0:
            return
        if self.is_contiguous():
            yield self.offset, self.numel
            return
        inner = 1
        dims = list(zip(self.shape, self.stride, strict=True))
        expected = 1
        while dims and dims[-1][1] == expected:  # fold contiguous trailing dims into one run
            inner *= dims[-1][0]
            expected *= dims[-1][0]
            dims.pop()
        idx = [0] * len(dims)
        while True:
            elem = self.storage_offset + sum(i * s for i, (_, s) in zip(idx, dims, strict=True))
            yield self.storage.offset + elem * self.itemsize, inner
            k = len(dims) - 1
            while k >= 0:
                idx[k] += 1
                if idx[k] < dims[k][0]:
                    break
                idx[k] = 0
                k -= 1
            if k < 0:
                return


# A frozen slotted dataclass's generated `__init__` sets each field through `object.__setattr__`, three times
# the cost of its slot's own setter; a scan makes one `StorageRef` and one `TensorRef` per storage of every
# rank file (hundreds of thousands at 4,096 ranks), so both get an `__init__` of the same signature that sets
# the slots directly. The records stay what the dataclass says: frozen, compared and hashed by their fields.
# Nearly every tensor has no attributes: they share one empty, read-only mapping (a dict each was 0.5 KB of
# every optimizer file's records, 2 MiB at 4,096 ranks); one that has some gets its own (`with_attrs`).
NO_ATTRS: Mapping[str, Any] = MappingProxyType({})
_STORAGE_SLOTS = tuple(getattr(StorageRef, f.name).__set__ for f in fields(StorageRef))
_TENSOR_SLOTS = tuple(getattr(TensorRef, f.name).__set__ for f in fields(TensorRef))


def _storage_init(self: StorageRef, path: str, key: str, dtype: str, offset: int, nbytes: int) -> None:
    s_path, s_key, s_dtype, s_offset, s_nbytes = _STORAGE_SLOTS
    s_path(self, path)
    s_key(self, key)
    s_dtype(self, dtype)
    s_offset(self, offset)
    s_nbytes(self, nbytes)


def _tensor_init(
    self: TensorRef,
    storage: StorageRef,
    storage_offset: int,
    shape: tuple[int, ...],
    stride: tuple[int, ...],
    dtype: str,
    attrs: Mapping[str, Any] | None = None,
) -> None:
    s_storage, s_offset, s_shape, s_stride, s_dtype, s_attrs = _TENSOR_SLOTS
    s_storage(self, storage)
    s_offset(self, storage_offset)
    s_shape(self, shape)
    s_stride(self, stride)
    s_dtype(self, dtype)
    s_attrs(self, NO_ATTRS if attrs is None else attrs)


def with_attrs(t: TensorRef, attrs: Mapping[str, Any]) -> None:
    """Give `t` its attributes (a tensor subclass's state, as its pickle restores them), merged into a
    mapping of its own."""
    _TENSOR_SLOTS[5](t, MappingProxyType({**t.attrs, **attrs}))


type.__setattr__(StorageRef, "__init__", _storage_init)
type.__setattr__(TensorRef, "__init__", _tensor_init)


def is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def dims(v: Any) -> tuple[int, ...] | None:
    """A shape or stride as a tuple of ints, or None if a pickle put anything else there."""
    if not isinstance(v, tuple | list) or len(v) > 64:
        return None
    if type(v) is tuple and all(type(d) is int for d in v):  # what every real pickle holds: already the answer
        return v
    if not all(is_int(d) for d in v):
        return None
    return tuple(int(d) for d in v)


_INT64_LIMIT = 2**63  # torch keeps sizes, strides and offsets as int64; a pickle may say anything


def view_problem(ref: TensorRef) -> str:
    """Why `ref` is not a view a real `torch.save` could have written, or "" if it is one.

    The one check every reader relies on (scan, plan, convert, verify, statistics): a view starts at a
    non-negative element offset, has non-negative sizes and strides, one stride per dimension, and every
    element it touches lies inside its storage; the storage lies inside its zip record (checked when the
    storage is loaded) and the record inside the file, clear of every other record (zipreader).
    """
    if ref.storage_offset < 0:
        return f"negative storage offset {ref.storage_offset}"
    numel = ref.numel
    if max((ref.storage_offset, *ref.shape, *ref.stride, numel)) >= _INT64_LIMIT:
        return "a size, stride or offset does not fit in 64 bits"
    if len(ref.shape) != len(ref.stride):
        return f"{len(ref.shape)} sizes but {len(ref.stride)} strides"
    if any(d < 0 for d in ref.shape):
        return f"negative size in shape {ref.shape}"
    if any(s < 0 for s in ref.stride):
        return f"negative stride in {ref.stride}"
    if ref.dtype not in ITEMSIZE:
        return f"unknown dtype {ref.dtype!r}"
    size = ITEMSIZE[ref.dtype]
    if numel == 0:
        return "" if ref.storage_offset * size <= ref.storage.nbytes else "offset past the end of its storage"
    if ref.extent_bytes() > ref.storage.nbytes:
        return (
            f"it reaches byte {ref.extent_bytes()} of a {ref.storage.nbytes}-byte storage "
            f"(offset {ref.storage_offset}, shape {ref.shape}, strides {ref.stride})"
        )
    runs = run_count(ref)
    if runs > MAX_RUNS or runs > max(1, ref.storage.nbytes // size):
        return (
            f"it is a strided or expanded view of {runs:,} separate pieces of a {ref.storage.nbytes:,}-byte "
            "storage; reading it piece by piece would cost out of proportion to the file "
            "(re-save it with .contiguous())"
        )
    return ""


MAX_RUNS = 1 << 20  # pieces one tensor view may have: each becomes a Segment (~100 bytes) in the scan


def run_count(ref: TensorRef) -> int:
    """How many contiguous runs `runs()` would yield, computed without yielding them."""
    if ref.numel == 0:
        return 0
    inner, expected = 1, 1
    dims = [(d, s) for d, s in zip(ref.shape, ref.stride, strict=True) if d != 1]
    while dims and dims[-1][1] == expected:
        inner *= dims[-1][0]
        expected *= dims[-1][0]
        dims.pop()
    return ref.numel // inner
