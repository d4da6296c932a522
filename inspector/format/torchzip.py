"""Read `torch.save` zip archives by offset, without torch.load and without running pickled code.

A DeepSpeed `.pt` file is a stored (uncompressed) zip: `<archive>/data.pkl` is the object tree and
`<archive>/data/<key>` are raw tensor storages. We parse the central directory ourselves (zip64 included),
rebuild the tree with a restricted unpickler that turns tensors into `TensorRef`s (where the bytes are) and
DeepSpeed's classes into inert records. A global that is not on the allowlist is refused, never called.
"""

from __future__ import annotations

import io
import os
import pickle
import re
from collections.abc import Callable
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
from inspector.format.views import StorageRef, TensorRef, dims, is_int, view_problem
from inspector.format.zipreader import TorchZip
from inspector.system.bytesource import ByteSource
from inspector.text import shown

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
        if not is_int(numel) or numel < 0 or dtype_tok.name not in ITEMSIZE:
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
        shape, strides = dims(size), dims(stride)
        if not is_int(offset) or shape is None or strides is None:
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


def load(
    path: str | os.PathLike[str], source: ByteSource | None = None, window: tuple[int, int] | None = None
) -> tuple[Any, TorchZip]:
    """Unpickle an archive's object tree with tensor references; returns (tree, archive).

    The file is opened through `source` (the checkpoint's folder; by default the file's own folder). The
    archive stays open so the caller can read bytes; close it when done. `window`: (base, length) of an
    archive embedded in the file (a DCP item); its tensors' offsets are the file's.
    """
    archive = TorchZip(path, source, window)
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
                f"{shown(archive.path)}: the pickle in this file cannot be read ({shown(why)[:200]}).",
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
