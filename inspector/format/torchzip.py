"""Read `torch.save` zip archives by offset, without torch.load and without running pickled code.

A DeepSpeed `.pt` file is a stored (uncompressed) zip: `<archive>/data.pkl` is the object tree and
`<archive>/data/<key>` are raw tensor storages. We parse the central directory ourselves (zip64 included),
rebuild the tree with a restricted unpickler that turns tensors into `TensorRef`s (where the bytes are) and
DeepSpeed's classes into inert records. A global that is not on the allowlist is refused, never called.
"""

from __future__ import annotations

import io
import math
import os
import pickle
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from inspector.errors import CorruptFileError, UnsafePickleError, UnsupportedCheckpointError
from inspector.format.dtypes import ITEMSIZE, STORAGE_DTYPES, TORCH_ALIASES, TORCH_NAMES, itemsize
from inspector.format.memoguard import TreeError, check_tree
from inspector.format.memoguard import check_memo as _check_memo
from inspector.format.records import (
    InertDict,
    Record,
    ZeroStage,
    _bytearray,
    _OrderedDict,
    _record_class,
    _safe_encode,
    _size,
    _Token,
)
from inspector.format.zipreader import TorchZip
from inspector.system.bytesource import ByteSource
from inspector.system.units import printable


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
    attrs: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)

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


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _dims(v: Any) -> tuple[int, ...] | None:
    """A shape or stride as a tuple of ints, or None if a pickle put anything else there."""
    if not isinstance(v, tuple | list) or len(v) > 64 or not all(_is_int(d) for d in v):
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
    if max((ref.storage_offset, *ref.shape, *ref.stride, ref.numel)) >= _INT64_LIMIT:
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
    if ref.numel == 0:
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


_INERT_RECORDS = {
    ("deepspeed.utils.tensor_fragment", "fragment_address"),
    ("deepspeed.runtime.fp16.loss_scaler", "LossScaler"),
    ("deepspeed.runtime.fp16.loss_scaler", "DynamicLossScaler"),
    ("deepspeed.runtime.fp16.loss_scaler", "LossScalerBase"),
    ("deepspeed.checkpoint.universal_checkpoint", "SubparamShape"),
    ("argparse", "Namespace"),
    ("numpy", "dtype"),
    ("numpy.core.multiarray", "scalar"),
    ("numpy._core.multiarray", "scalar"),
}
_INERT_DICTS = {
    ("lightning_fabric.utilities.data", "AttributeDict"),
    ("pytorch_lightning.utilities.parsing", "AttributeDict"),
    ("lightning.fabric.utilities.data", "AttributeDict"),
}
_PLAIN_NAME = re.compile(r"[A-Za-z0-9_.]{1,200}")
_PY2_MODULES = {"__builtin__": "builtins", "copy_reg": "copyreg"}
_RECORD_CLASSES: dict[tuple[str, str], type[Record]] = {k: _record_class(*k) for k in _INERT_RECORDS}


class SafeUnpickler(pickle.Unpickler):
    """Rebuilds a torch pickle with TensorRefs and inert records; refuses any other global."""

    def __init__(self, data: bytes, archive: TorchZip) -> None:
        super().__init__(io.BytesIO(data), encoding="utf-8")
        self.archive = archive
        self._storages: dict[str, StorageRef] = {}

    def find_class(self, module: str, name: str) -> Any:
        if module in _PY2_MODULES:  # protocol-2 pickles spell `builtins` as `__builtin__` (set, bytearray)
            module = _PY2_MODULES[module]
        stand_in = self._stand_in(module, name)
        if stand_in is None:
            shown = f"{module}.{name}"
            if not _PLAIN_NAME.fullmatch(
                shown
            ):  # a crafted name must not smuggle terminal escapes into output
                shown = ascii(shown)
            raise UnsafePickleError(
                f"{self.archive.path}: the pickle asks for `{shown}`, which is not on the allowlist "
                "of classes a DeepSpeed checkpoint uses. Nothing was executed.",
                hint="If you wrote this file yourself and trust it, load it with torch.load; otherwise "
                "treat it as hostile. Please report the name if it comes from a genuine DeepSpeed run.",
            )
        return stand_in

    def _stand_in(self, module: str, name: str) -> Any:
        key = (module, name)
        if key == ("collections", "OrderedDict"):
            return _OrderedDict
        if module == "builtins" and name in ("set", "frozenset", "complex", "slice", "bytearray"):
            return {
                "set": set,
                "frozenset": frozenset,
                "complex": complex,
                "slice": slice,
                "bytearray": _bytearray,
            }[name]
        if key == ("_codecs", "encode"):
            return _safe_encode
        if key == ("torch.storage", "UntypedStorage"):  # _rebuild_tensor_v3 (uint16, float8, ...)
            return _Token("uint8")
        if module == "torch._utils":
            return {
                "_rebuild_tensor_v2": self._rebuild_tensor_v2,
                "_rebuild_tensor_v3": self._rebuild_tensor_v3,
                "_rebuild_parameter": _rebuild_parameter,
                "_rebuild_parameter_with_state": _rebuild_parameter,
            }.get(name)
        if key == ("torch._tensor", "_rebuild_from_type_v2"):
            return _rebuild_from_type_v2
        if module == "torch":
            if name in STORAGE_DTYPES:
                return _Token(STORAGE_DTYPES[name])
            if name in TORCH_NAMES:
                return _Token(TORCH_ALIASES.get(name, name))
            if name == "Size":
                return _size
            if name == "device":
                return _device
            if name == "Tensor":
                return _Token("torch.Tensor")
            return None
        if key == ("torch.nn.parameter", "Parameter"):
            return _Token("torch.nn.Parameter")
        if key == ("deepspeed.runtime.zero.config", "ZeroStageEnum"):
            return _zero_stage  # a function, not the class: BUILD on a class would patch it process-wide
        if key in _RECORD_CLASSES:
            return _RECORD_CLASSES[key]
        if key in _INERT_DICTS:
            return InertDict
        if module == "pathlib" and name in (
            "PosixPath",
            "PurePosixPath",
            "WindowsPath",
            "PureWindowsPath",
            "Path",
        ):
            return _path
        return None

    def persistent_load(self, pid: Any) -> StorageRef:
        if not (
            isinstance(pid, tuple) and len(pid) == 5 and pid[0] == "storage" and isinstance(pid[1], _Token)
        ):
            raise pickle.UnpicklingError("a persistent id that is not a torch storage")
        _, dtype_tok, key, _location, numel = pid
        if not _is_int(numel) or numel < 0 or dtype_tok.name not in ITEMSIZE:
            raise pickle.UnpicklingError(f"bad storage size or dtype in persistent id {key!r}")
        key = str(key)
        ref = self._storages.get(key)
        if ref is None:
            offset, size = self.archive.record(key)
            need = int(numel) * itemsize(dtype_tok.name)
            if need > size:
                raise CorruptFileError(
                    f"{self.archive.path}: storage {key} should hold {need} bytes but the record has {size}.",
                    hint="The file is damaged; copy it again from the source.",
                )
            ref = StorageRef(self.archive.path, key, dtype_tok.name, offset, need)
            self._storages[key] = ref
        return ref

    def _tensor(self, storage: StorageRef, offset: Any, size: Any, stride: Any, dtype: str) -> TensorRef:
        if not isinstance(storage, StorageRef):
            raise pickle.UnpicklingError("a tensor rebuilt from something that is not a storage")
        shape, strides = _dims(size), _dims(stride)
        if not _is_int(offset) or shape is None or strides is None:
            raise self._bad_view(storage, "its offset, shape or strides are not whole numbers")
        ref = TensorRef(storage, int(offset), shape, strides, dtype)
        problem = view_problem(ref)
        if problem:
            raise self._bad_view(storage, problem)
        return ref

    def _bad_view(self, storage: StorageRef, problem: str) -> CorruptFileError:
        return CorruptFileError(
            f"{self.archive.path}: a tensor view of storage {storage.key} is invalid: {problem}.",
            hint="The file is damaged or crafted; copy it again from the source.",
        )

    def _rebuild_tensor_v2(
        self,
        storage: StorageRef,
        offset: int,
        size: Any,
        stride: Any,
        requires_grad: bool = False,
        hooks: Any = None,
        metadata: Any = None,
    ) -> TensorRef:
        return self._tensor(storage, offset, size, stride, storage.dtype)

    def _rebuild_tensor_v3(
        self,
        storage: StorageRef,
        offset: int,
        size: Any,
        stride: Any,
        requires_grad: bool,
        hooks: Any,
        dtype: _Token,
        metadata: Any = None,
    ) -> TensorRef:
        return self._tensor(storage, offset, size, stride, dtype.name)


def _rebuild_parameter(data: Any, requires_grad: Any = None, hooks: Any = None, state: Any = None) -> Any:
    return data


def _rebuild_from_type_v2(func: Callable[..., Any], new_type: Any, args: tuple[Any, ...], state: Any) -> Any:
    # `func` came through find_class, so it is one of our stand-ins.
    obj = func(*args)
    if isinstance(obj, TensorRef) and isinstance(state, dict):
        obj.attrs.update(state)
    return obj


def _zero_stage(value: Any) -> ZeroStage:
    return ZeroStage(value)


def _device(*args: Any) -> str:
    return ":".join(str(a) for a in args)


def _path(*parts: Any) -> str:
    return os.path.join(*(str(p) for p in parts)) if parts else ""


def load(path: str | os.PathLike[str], source: ByteSource | None = None) -> tuple[Any, TorchZip]:
    """Unpickle an archive's object tree with tensor references; returns (tree, archive).

    The file is opened through `source` (the checkpoint's folder; by default the file's own folder). The
    archive stays open so the caller can read bytes; close it when done.
    """
    archive = TorchZip(path, source)
    try:
        if archive.byteorder() != "little":
            raise UnsupportedCheckpointError(f"{archive.path}: big-endian checkpoints are not supported.")
        data = archive.read_entry(f"{archive.prefix}data.pkl")
        try:
            _check_memo(data)
            tree = SafeUnpickler(data, archive).load()
            check_tree(tree, len(data))
        except (
            MemoryError,
            RecursionError,
            TreeError,
            pickle.UnpicklingError,
            EOFError,
            ValueError,
            TypeError,
            AttributeError,
            IndexError,
            KeyError,
            UnicodeDecodeError,
        ) as exc:
            why = str(exc) if isinstance(exc, TreeError | pickle.UnpicklingError) else type(exc).__name__
            raise CorruptFileError(
                f"{printable(archive.path)}: the pickle in this file cannot be read ({printable(why)[:200]}).",
                hint="The file is damaged or not a DeepSpeed checkpoint.",
            ) from None
    except BaseException:
        archive.close()
        raise
    return tree, archive


def load_tree(path: str | os.PathLike[str], source: ByteSource | None = None) -> Any:
    """Just the object tree (tensor references keep their file path and offsets)."""
    tree, archive = load(path, source)
    archive.close()
    return tree
