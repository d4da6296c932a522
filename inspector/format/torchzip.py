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
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from inspector.errors import CorruptFileError, UnsafePickleError, UnsupportedCheckpointError
from inspector.format import rankrepeat
from inspector.format.dtypes import ITEMSIZE, STORAGE_DTYPES, TORCH_ALIASES, TORCH_NAMES
from inspector.format.legacy import MAGIC_NUMBER, PROTOCOL_VERSION, LegacyTorchFile
from inspector.format.memoguard import TreeError, check_tree, passed, remember
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
from inspector.format.replay import learn, seen, template_for
from inspector.format.views import StorageRef, TensorRef, dims, is_int, view_problem, with_attrs
from inspector.format.zipreader import _HEADER_PAGE as HEAD_PAGE
from inspector.format.zipreader import TorchZip
from inspector.system.bytesource import ByteSource, Handle, open_handle_in
from inspector.text import shown

WHOLE_FILE = 64 << 10  # files up to this size are read whole by their first read (see `load`)
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


# Views `view_problem` passed, by everything its verdict depends on (the storage's size, the view, the dtype):
# the rank files of one save describe the same views again and again. Bounded; cleared when full.
_GOOD_VIEWS: set[tuple[int, int, tuple[int, ...], tuple[int, ...], str]] = set()
_GOOD_VIEWS_MAX = 8192  # a few hundred KiB at most


class SafeUnpickler(pickle.Unpickler):
    """Rebuilds a torch pickle with TensorRefs and inert records; refuses any other global."""

    def __init__(self, data: bytes, archive: TorchZip | LegacyTorchFile) -> None:
        super().__init__(io.BytesIO(data), encoding="utf-8")
        self.archive = archive
        self._found: dict[tuple[str, str], Any] = {}  # this pickle's globals: a torch pickle repeats a few

    def find_class(self, module: str, name: str) -> Any:
        found = self._found.get((module, name))
        if found is None:
            found = self._found[(module, name)] = self._allowed(module, name)
        return found

    def _allowed(self, module: str, name: str) -> Any:
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
        """A storage by its persistent id: `('storage', type, key, location, numel)` in the zip form, with a
        sixth item (a storage view, or None) in the legacy form; the container says where its bytes are."""
        if not (
            isinstance(pid, tuple)
            and len(pid) in (5, 6)
            and pid[0] == "storage"
            and isinstance(pid[1], _Token)
            and isinstance(pid[2], str | int)
        ):
            raise pickle.UnpicklingError("a persistent id that is not a torch storage")
        dtype_tok, key, numel = pid[1], str(pid[2]), pid[4]
        if not is_int(numel) or numel < 0 or dtype_tok.name not in ITEMSIZE:
            raise pickle.UnpicklingError(f"bad storage size or dtype in persistent id {shown(key)}")
        view = pid[5] if len(pid) == 6 else None
        if view is not None and not (
            isinstance(view, tuple) and len(view) == 3 and is_int(view[1]) and is_int(view[2])
        ):
            raise pickle.UnpicklingError("a storage view that is not (key, offset, size)")
        if view is not None:
            view = (str(view[0]), int(view[1]), int(view[2]))
        return self.archive.storage(key, dtype_tok.name, int(numel), view)

    def _tensor(self, storage: StorageRef, offset: Any, size: Any, stride: Any, dtype: str) -> TensorRef:
        if not isinstance(storage, StorageRef):
            raise pickle.UnpicklingError("a tensor rebuilt from something that is not a storage")
        shape, strides = dims(size), dims(stride)
        if not is_int(offset) or shape is None or strides is None:
            raise self._bad_view(storage, "its offset, shape or strides are not whole numbers")
        ref = TensorRef(storage, int(offset), shape, strides, dtype)
        key = (storage.nbytes, ref.storage_offset, shape, strides, dtype)
        if key not in _GOOD_VIEWS:  # the verdict depends on these alone; rank files repeat them
            problem = view_problem(ref)
            if problem:
                raise self._bad_view(storage, problem)
            if len(_GOOD_VIEWS) >= _GOOD_VIEWS_MAX:
                _GOOD_VIEWS.clear()
            _GOOD_VIEWS.add(key)
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
        with_attrs(obj, state)
    return obj


def _zero_stage(value: Any) -> ZeroStage:
    return ZeroStage(value)


def _device(*args: Any) -> str:
    return ":".join(str(a) for a in args)


def _path(*parts: Any) -> str:
    return os.path.join(*(str(p) for p in parts)) if parts else ""


def load(
    path: str | os.PathLike[str],
    source: ByteSource | None = None,
    window: tuple[int, int] | None = None,
    handle: Handle | None = None,
    skip: frozenset[str] = frozenset(),
) -> tuple[Any, TorchZip | LegacyTorchFile]:
    """Unpickle a `torch.save` file's object tree with tensor references; returns (tree, container).

    The one entry point for both containers: a file that starts with a pickle is the legacy form, anything
    else is read as a zip. The file is opened through `source` (the checkpoint's folder; by default the
    file's own folder). The container stays open so the caller can read bytes; close it when done.
    `window`: (base, length) of a zip archive embedded in the file (a DCP item); its tensors' offsets are
    the file's. `handle`: the archive already open (a decompressed DCP item), read as a zip. `skip`: keys
    of the root whose values the caller does not read; a tree rebuilt from a pickle met before may hold a
    flat mapping of tensors there as its names mapped to None (`replay`), its records still checked.
    """
    path = os.fspath(path)
    embedded = window is not None or handle is not None  # a DCP item: a zip, never the legacy form
    handle = handle if handle is not None else open_handle_in(path, (source,) if source else ())
    try:
        # a small file is read whole at once (a stage-3 rank's model-states file, tens of KB: one read where
        # its end records, directory, pickle and headers took six; from a bucket, one request), and so is
        # one that repeats an earlier rank's archive read mostly through (`rankrepeat.whole`)
        whole = handle.size <= WHOLE_FILE or rankrepeat.whole(handle.size)
        size = handle.size if whole else HEAD_PAGE
        head = handle.pread(size, 0) if not embedded and handle.size > 0 else b""
        if head[:1] == b"\x80":
            legacy = LegacyTorchFile(path, handle)
            archive: TorchZip | LegacyTorchFile = legacy
            with _unreadable_pickle(legacy.shown):
                tree, nbytes = _legacy_tree(legacy)
                check_tree(tree, nbytes)
        else:
            archive = TorchZip(path, source, handle, window, head)  # the page sniffed: not read again
            if archive.byteorder() != "little":
                raise UnsupportedCheckpointError(
                    f"{archive.shown}: big-endian checkpoints are not supported."
                )
            tree = _zip_tree(archive, skip)
    except BaseException:
        handle.close()
        raise
    return tree, archive


def _zip_tree(archive: TorchZip, skip: frozenset[str] = frozenset()) -> Any:
    """The zip form's object tree, through both guards; the same pickle bytes as a file read before (every
    rank of a save writes much the same pickle) passed them already, and from the third time on are not
    unpickled at all (`replay`: the first tree, its tensors pointed at this archive's records)."""
    name = f"{archive.prefix}data.pkl"
    data = archive.read_entry(name, seen)  # bytes a template keeps, under their CRC: not summed again
    crc = archive.entries[name].crc
    template = template_for(data, crc)
    if template is not None:  # these bytes were unpickled before: the tree rebuilt onto this archive
        tree = template.rebuild(archive, skip)
        if archive.repeats is None:  # read in full: the next rank's archive may repeat it (`rankrepeat`)
            rankrepeat.learn(archive, *template.asked(skip), archive.storages())
        return tree
    known = passed(data)
    with _unreadable_pickle(archive.shown):
        if not known:
            _check_memo(data)
        tree = SafeUnpickler(data, archive).load()
        if not known:
            check_tree(tree, len(data))
    if not known:
        remember(data)
    else:  # met a second time: the rank files of a save repeat it, so keep what rebuilds it
        learn(data, tree, archive, crc)
    return tree


def _legacy_tree(archive: LegacyTorchFile) -> tuple[Any, int]:
    """The legacy container's object tree and its pickle's size. Its storages are located only after the
    object is read (the dtypes of the 8-byte counts come from it), so the object is unpickled twice: once
    to learn what each storage holds, once more to build views onto where the bytes really are."""
    header = [_small_pickle(archive) for _ in range(3)]
    magic, protocol, info = header
    if magic != MAGIC_NUMBER or protocol != PROTOCOL_VERSION or not isinstance(info, dict):
        raise CorruptFileError(
            f"{archive.shown}: starts with a pickle but not with torch.save's legacy header.",
            hint="Only DeepSpeed/torch .pt files can be read here.",
        )
    if info.get("little_endian") is not True:
        raise UnsupportedCheckpointError(f"{archive.shown}: big-endian checkpoints are not supported.")
    data = archive.next_pickle()
    _check_memo(data)
    SafeUnpickler(data, archive).load()
    archive.locate(_small_pickle(archive))
    return SafeUnpickler(data, archive).load(), len(data)


def _small_pickle(archive: LegacyTorchFile) -> Any:
    """One of the legacy container's plain pickles (header values, the key list), through the same guards."""
    data = archive.next_pickle()
    _check_memo(data)
    value = SafeUnpickler(data, archive).load()
    check_tree(value, len(data))
    return value


@contextmanager
def _unreadable_pickle(name: str) -> Iterator[None]:
    """Whatever goes wrong inside a pickle becomes one clear refusal naming the file, never a traceback."""
    try:
        yield
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
            f"{name}: the pickle in this file cannot be read ({shown(why)[:200]}).",
            hint="The file is damaged or not a DeepSpeed checkpoint.",
        ) from None


def load_tree(path: str | os.PathLike[str], source: ByteSource | None = None) -> Any:
    """Just the object tree (tensor references keep their file path and offsets)."""
    tree, archive = load(path, source)
    archive.close()
    return tree
