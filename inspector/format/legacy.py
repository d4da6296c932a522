"""The legacy (non-zip) `torch.save` container, located by offset like the zip one (`zipreader`).

Written by `torch.save(..., _use_new_zipfile_serialization=False)` (DeepSpeed's
`checkpoint_serialization: false`, FastPersist's writer) and by every torch before 1.6. The file is pickles
back to back, then the raw storages: the magic number, the protocol version, a sys-info dict, the object
(its persistent ids name storages by key, with their dtype and element count), the sorted list of storage
keys, then for each key in that order an 8-byte little-endian element count followed by the storage's bytes.

Nothing says where a pickle ends or where a storage starts, so the file is read sequentially once: each
pickle's end is found by walking its opcodes (`memoguard.pickle_end`) in a window that doubles until the
pickle fits, and the storages are located by walking their 8-byte headers, each of which must repeat the
element count the object declared. Every step moves forward by at least one byte, so a hostile file cannot
make the walk loop; every storage lies inside the file, after the previous one.
"""

from __future__ import annotations

import os

from inspector.errors import CorruptFileError
from inspector.format.container import Container
from inspector.format.dtypes import itemsize
from inspector.format.memoguard import pickle_end
from inspector.format.views import StorageRef
from inspector.system.bytesource import Handle
from inspector.text import shown

MAGIC_NUMBER = 0x1950A86A20F9469CFC6C
PROTOCOL_VERSION = 1001
_FIRST_WINDOW = 1 << 16


class LegacyTorchFile(Container):
    """A legacy `torch.save` file opened read-only through a confined handle; its pickles are taken one by
    one (`next_pickle`), then its storages located (`locate`), then served as `StorageRef`s (`storage`)."""

    def __init__(self, path: str | os.PathLike[str], handle: Handle) -> None:
        self.path = os.fspath(path)
        self.handle = handle
        self.file_size = handle.size
        self._pos = 0  # where the next pickle (then the first storage header) starts
        self._declared: dict[str, tuple[str, int]] = {}  # storage key -> (dtype, element count)
        self._located: dict[str, int] | None = None  # storage key -> absolute offset of its bytes

    def damaged(self, why: str) -> CorruptFileError:
        return CorruptFileError(
            f"{self.shown}: this legacy torch.save file is truncated or damaged ({why}; "
            f"file size {self.file_size} bytes).",
            hint="It was probably cut off while saving or copying; copy it again from the source.",
        )

    def next_pickle(self) -> bytes:
        """The bytes of the pickle that starts where the previous one ended; the window read doubles until
        the pickle's STOP is inside it, so reading costs at most twice the pickle's size."""
        rest = self.file_size - self._pos
        want = min(_FIRST_WINDOW, rest)
        while want > 0:
            window = self.pread(want, self._pos)
            end = pickle_end(window)
            if end is not None:
                self._pos += end
                return window[:end]
            if want == rest:
                break
            want = min(2 * want, rest)
        raise self.damaged(f"a pickle that starts at byte {self._pos} does not end inside the file")

    def storage(self, key: str, dtype: str, numel: int, view: tuple[str, int, int] | None) -> StorageRef:
        """The storage a persistent id names. Before `locate` it only records what the object declares (the
        first declaration of a key decides its dtype, as in torch) and answers with a provisional offset of
        0; after `locate` it answers with where the bytes are."""
        declared = self._declared.setdefault(key, (dtype, numel))
        if self._located is None:
            root = StorageRef(self.path, key, declared[0], 0, declared[1] * itemsize(declared[0]))
        else:
            root = StorageRef(
                self.path, key, declared[0], self._located[key], declared[1] * itemsize(declared[0])
            )
        if view is None:
            return root
        view_key, first, count = view
        size = itemsize(dtype)
        if first < 0 or count < 0 or (first + count) * size > root.nbytes:
            raise CorruptFileError(
                f"{self.shown}: storage view {shown(view_key)} reaches past its storage {shown(key)}.",
                hint="The file is damaged or crafted; copy it again from the source.",
            )
        return StorageRef(self.path, view_key, dtype, root.offset + first * size, count * size)

    def locate(self, keys: object) -> None:
        """Walk the storage headers once, in the order of the key list (the pickle after the object): each
        8-byte count must equal what the object declared for that key, and each storage must fit the file."""
        if not isinstance(keys, list) or not all(isinstance(k, str) for k in keys):
            raise self.damaged("the list of storage keys is not a list of names")
        if len(set(keys)) != len(keys) or set(keys) != set(self._declared):
            raise self.damaged(
                f"the object names {len(self._declared)} storages but the key list has {len(keys)} "
                "that do not match them"
            )
        located: dict[str, int] = {}
        pos = self._pos
        for key in keys:  # pos grows by at least 8 each step; the list is bounded by its pickle
            dtype, numel = self._declared[key]
            count = int.from_bytes(self.pread(8, pos), "little", signed=True)
            if count != numel:
                raise self.damaged(
                    f"storage {shown(key)} at byte {pos} says {count} elements where its tensors declare {numel}"
                )
            start = pos + 8
            pos = start + count * itemsize(dtype)
            if pos > self.file_size:
                raise self.damaged(f"storage {shown(key)} runs to byte {pos}, past the end of the file")
            located[key] = start
        self._located = located
