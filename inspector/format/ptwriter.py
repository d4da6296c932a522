# mypy: disable-error-code="attr-defined,assignment"
# (typeshed does not describe the pure-Python pickle._Pickler we extend)
"""Write `torch.save`-compatible zip archives whose storages are streamed, never held in memory.

Used by the demo checkpoint writer, with numpy only (no torch): the object tree is pickled (protocol 2, like torch) with storages as
persistent ids, then each storage record is produced chunk by chunk. DeepSpeed's classes are emitted as
plain GLOBAL references, so deepspeed need not be installed to write a checkpoint it can read.
"""

from __future__ import annotations

import io
import pickle
import struct
import zlib
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, BinaryIO

import numpy as np

from inspector.format.crc import crc32_combine
from inspector.format.dtypes import STORAGE_CLASSES, numpy_dtype

ALIGN = 64
# an entry this small is checksummed twice (its own CRC, the file's) rather than combined: a combine's
# Python costs more than ~100 KB of zlib (a universal export writes thousands of files of 7 small entries)
DIRECT = 64 << 10

Producer = Callable[[int, int], "np.ndarray[Any, Any]"]
"""Return elements [start, start+count) of a storage as a numpy array (cast to the storage's dtype if not
already in it: values are rounded by numpy, which matches torch for every non-NaN value)."""


@dataclass(eq=False)
class Storage:
    """A storage to be streamed: dtype, element count, and a producer of its values."""

    dtype: str
    numel: int
    produce: Producer | None = None
    key: str | None = field(default=None, init=False)


@dataclass(eq=False)
class Tensor:
    """A view onto a Storage, pickled exactly as torch pickles a tensor (`_rebuild_tensor_v2`)."""

    storage: Storage
    shape: tuple[int, ...]
    offset: int = 0

    @property
    def stride(self) -> tuple[int, ...]:
        out, acc = [], 1
        for d in reversed(self.shape):
            out.append(acc)
            acc *= d
        return tuple(reversed(out))


@dataclass(frozen=True, eq=False)
class Global:
    """A reference to `module.name`, written as a GLOBAL opcode without importing it."""

    module: str
    name: str


@dataclass(eq=False)
class Reduce:
    """`func(*args)` at load time (REDUCE)."""

    func: Global
    args: tuple[Any, ...]


@dataclass(eq=False)
class Obj:
    """An instance built with NEWOBJ and BUILD(state), as dataclasses and plain classes pickle."""

    cls: Global
    state: dict[str, Any]


def size(shape: tuple[int, ...]) -> Reduce:
    return Reduce(Global("torch", "Size"), (tuple(shape),))


class _Pickler(pickle._Pickler):  # type: ignore[name-defined, misc]
    """The pure-Python pickler, so we can emit GLOBALs for classes that are not importable here."""

    dispatch = pickle._Pickler.dispatch.copy()  # type: ignore[attr-defined]

    def __init__(self, fh: io.BytesIO) -> None:
        super().__init__(fh, protocol=2)
        self.storages: list[Storage] = []
        self._globals: dict[tuple[str, str], Global] = {}  # the first of each name: the one written

    def persistent_id(self, obj: Any) -> Any:
        if isinstance(obj, Storage):
            if obj.key is None:
                obj.key = str(len(self.storages))
                self.storages.append(obj)
            return ("storage", Global("torch", STORAGE_CLASSES[obj.dtype]), obj.key, "cpu", obj.numel)
        return None

    def save_marker_global(self, obj: Global) -> None:
        first = self._globals.setdefault((obj.module, obj.name), obj)
        if first is not obj:  # as torch's pickler: each global written once, referred back to (memo GET)
            self.save(first)
            return
        self.write(pickle.GLOBAL + f"{obj.module}\n{obj.name}\n".encode())
        self.memoize(obj)

    def save_marker_reduce(self, obj: Reduce) -> None:
        self.save(obj.func)
        self.save(obj.args)
        self.write(pickle.REDUCE)
        self.memoize(obj)

    def save_marker_obj(self, obj: Obj) -> None:
        self.save(obj.cls)
        self.save(())
        self.write(pickle.NEWOBJ)
        self.memoize(obj)
        self.save(obj.state)
        self.write(pickle.BUILD)

    def save_marker_tensor(self, obj: Tensor) -> None:
        hooks = Reduce(Global("collections", "OrderedDict"), ())
        self.save_marker_reduce(
            Reduce(
                Global("torch._utils", "_rebuild_tensor_v2"),
                (obj.storage, obj.offset, size(obj.shape), obj.stride, False, hooks),
            )
        )

    def save_ordered_dict(self, obj: OrderedDict[Any, Any]) -> None:
        self.save(Global("collections", "OrderedDict"))
        self.save(())
        self.write(pickle.REDUCE)
        self.memoize(obj)
        self._batch_setitems(iter(obj.items()))

    dispatch[Global] = save_marker_global
    dispatch[Reduce] = save_marker_reduce
    dispatch[Obj] = save_marker_obj
    dispatch[Tensor] = save_marker_tensor
    dispatch[OrderedDict] = save_ordered_dict


class _ZipOut:
    """A stored zip written the way torch writes it: 64-byte aligned data, zip64 directory."""

    def __init__(self, fh: BinaryIO) -> None:
        self.fh = fh
        self.central: list[bytes] = []
        self.crc = 0  # of every byte written so far: the file's CRC-32 in hand, never read back
        self.pos = fh.tell()  # counted as it goes: a buffered file's tell() is a seek call each time

    def _put(self, data: bytes) -> None:
        """Small bytes (headers, records): written and checksummed as they go."""
        self.crc = zlib.crc32(data, self.crc)
        self.fh.write(data)
        self.pos += len(data)

    def entry(self, name: str, chunks: Iterator[bytes | memoryview]) -> None:
        offset = self.pos
        raw = name.encode()
        pad = (-(offset + 30 + len(raw) + 4)) % ALIGN
        extra = struct.pack("<HH", 0x4246, pad) + b"Z" * pad
        self._put(
            struct.pack("<4s5H3L2H", b"PK\x03\x04", 45, 0x0808, 0, 0, 0x21, 0, 0, 0, len(raw), len(extra))
            + raw
            + extra
        )
        crc = n = 0
        whole: int | None = self.crc  # the file's CRC carried through the entry's first DIRECT bytes
        for chunk in chunks:
            crc = zlib.crc32(chunk, crc)  # the one pass over a big entry's bytes: the file's CRC is combined
            n += len(chunk)
            self.fh.write(chunk)
            if whole is not None:
                whole = zlib.crc32(chunk, whole) if n <= DIRECT else None
        self.pos += n
        self.crc = whole if whole is not None else crc32_combine(self.crc, crc, n)
        self._put(struct.pack("<4sLQQ", b"PK\x07\x08", crc, n, n))
        z64 = struct.pack("<HHQQQ", 1, 24, n, n, offset)
        self.central.append(
            struct.pack(
                "<4s6H3L5HLL",
                b"PK\x01\x02",
                45,
                45,
                0x0808,
                0,
                0,
                0x21,
                crc,
                0xFFFFFFFF,
                0xFFFFFFFF,
                len(raw),
                len(z64),
                0,
                0,
                0,
                0,
                0xFFFFFFFF,
            )
            + raw
            + z64
        )

    def finish(self) -> None:
        cd_off = self.pos
        for rec in self.central:
            self._put(rec)
        cd_size = self.pos - cd_off
        eocd64 = self.pos
        count = len(self.central)
        self._put(struct.pack("<4sQ2H2L4Q", b"PK\x06\x06", 44, 45, 45, 0, 0, count, count, cd_size, cd_off))
        self._put(struct.pack("<4sLQL", b"PK\x06\x07", 0, eocd64, 1))
        self._put(struct.pack("<4s4H2LH", b"PK\x05\x06", 0, 0, 0xFFFF, 0xFFFF, 0xFFFFFFFF, 0xFFFFFFFF, 0))


def _storage_chunks(st: Storage, chunk_elems: int) -> Iterator[memoryview]:
    dtype = numpy_dtype(st.dtype)
    for start in range(0, st.numel, chunk_elems):
        count = min(chunk_elems, st.numel - start)
        if st.produce is None:
            a = np.zeros(count, dtype=dtype)
        else:
            a = np.ascontiguousarray(
                np.asarray(st.produce(start, count)).reshape(-1).astype(dtype, copy=False)
            )
            assert a.shape[0] == count, (a.shape, count)
        yield a.view(np.uint8).data


def dump(obj: Any, fh: BinaryIO, archive: str, chunk_elems: int = 1 << 22) -> int:
    """Write `obj` to the open file `fh` as `torch.save` would (the archive folder named `archive`, as torch
    names it after the file), streaming storages; returns bytes written. Creating, naming and renaming the file
    is the caller's (through its OutputRoot)."""
    return _dump(obj, fh, archive, chunk_elems)[0]


def dump_crc(obj: Any, fh: BinaryIO, archive: str, chunk_elems: int = 1 << 22) -> tuple[int, int]:
    """`dump`, returning (bytes written, the CRC-32 of the whole file): the entries' checksums the zip needs
    anyway, combined, so a caller that journals the file's CRC never reads it back. `fh` must start empty."""
    if fh.tell() != 0:
        raise ValueError("dump_crc: the file must start empty (its CRC covers the whole file)")
    return _dump(obj, fh, archive, chunk_elems)


def _dump(obj: Any, fh: BinaryIO, archive: str, chunk_elems: int) -> tuple[int, int]:
    buf = io.BytesIO()
    pickler = _Pickler(buf)
    pickler.dump(obj)
    z = _ZipOut(fh)
    z.entry(f"{archive}/data.pkl", iter([buf.getvalue()]))
    z.entry(f"{archive}/.format_version", iter([b"1"]))
    z.entry(f"{archive}/.storage_alignment", iter([b"64"]))
    z.entry(f"{archive}/byteorder", iter([b"little"]))
    for st in pickler.storages:
        z.entry(f"{archive}/data/{st.key}", _storage_chunks(st, chunk_elems))
    z.entry(f"{archive}/version", iter([b"3\n"]))
    z.entry(f"{archive}/.data/serialization_id", iter([b"0" * 40]))
    z.finish()
    return z.pos, z.crc
