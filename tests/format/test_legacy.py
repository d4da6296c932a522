"""The legacy (non-zip) `torch.save` container: read through the same entry point and the same restricted
unpickler as the zip form, bit for bit what torch.load gives; damaged and crafted files are refused clearly.

Files are made by torch itself (`_use_new_zipfile_serialization=False`), then cut or patched where the format
says a field lies, so every hostile variant is the real layout with one thing wrong.
"""

from __future__ import annotations

import itertools
import os
import pickle
import struct
from collections import OrderedDict
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from inspector.errors import CorruptFileError, UnsafePickleError, UnsupportedCheckpointError
from inspector.format.legacy import LegacyTorchFile
from inspector.format.memoguard import pickle_end
from inspector.format.torchzip import TensorRef, load, load_tree


def _objects() -> dict[str, Any]:
    base = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    return {
        "f32": base,
        "view": base[1:, 2:],  # shares the storage of f32, strided
        "bf16": torch.linspace(-3, 3, 7).to(torch.bfloat16),
        "f16": torch.arange(5, dtype=torch.float16),
        "i64": torch.tensor([1, -2, 3]),
        "u8": torch.arange(3, dtype=torch.uint8),
        "empty": torch.zeros(0),
        "param": torch.nn.Parameter(torch.ones(2, 2)),
        "meta": OrderedDict(step=3, names=["a", "b"]),
    }


def _bytes_of(raw: bytes, ref: TensorRef) -> bytes:
    return b"".join(raw[off : off + n * ref.itemsize] for off, n in ref.runs())


def _torch_bytes(t: torch.Tensor) -> bytes:
    flat = t.detach().contiguous().reshape(-1)
    return flat.view(torch.uint8).numpy().tobytes() if flat.numel() else b""


@pytest.mark.parametrize("protocol", [2, 4])
def test_legacy_reads_what_torch_load_reads(tmp_path: Path, protocol: int) -> None:
    """Every tensor's bytes, located by offset, equal torch.load's; both containers give the same tree."""
    objs = _objects()
    legacy, zipped = tmp_path / "legacy.pt", tmp_path / "zip.pt"
    torch.save(objs, legacy, _use_new_zipfile_serialization=False, pickle_protocol=protocol)
    torch.save(objs, zipped, pickle_protocol=protocol)
    assert legacy.read_bytes()[:1] == b"\x80"
    back = torch.load(legacy, weights_only=False)  # made just above by torch itself
    tree, container = load(legacy)
    container.close()
    assert isinstance(container, LegacyTorchFile)
    raw = legacy.read_bytes()
    other = load_tree(zipped)
    for name, value in back.items():
        if isinstance(value, torch.Tensor):
            ref = tree[name]
            assert isinstance(ref, TensorRef)
            assert ref.shape == tuple(value.shape) and ref.dtype == str(value.dtype).removeprefix("torch.")
            assert _bytes_of(raw, ref) == _torch_bytes(value), name
            assert (ref.shape, ref.stride, ref.dtype) == (
                other[name].shape,
                other[name].stride,
                other[name].dtype,
            )
        else:
            assert tree[name] == value == other[name]


def test_storages_lie_in_order_inside_the_file(tmp_path: Path) -> None:
    """Each storage starts 8 bytes after its count and ends before the next count: no two overlap."""
    path = tmp_path / "legacy.pt"
    torch.save(
        {"a": torch.ones(3), "b": torch.zeros(4, dtype=torch.float64)},
        path,
        _use_new_zipfile_serialization=False,
    )
    tree = load_tree(path)
    spans = sorted((r.storage.offset, r.storage.offset + r.storage.nbytes) for r in tree.values())
    assert all(end + 8 <= nxt for (_, end), (nxt, _) in itertools.pairwise(spans))
    assert spans[-1][1] <= os.path.getsize(path)


# --- damaged and crafted files ------------------------------------------------------------------------------


def _legacy_file(tmp_path: Path, obj: Any = None) -> tuple[Path, bytes]:
    path = tmp_path / "legacy.pt"
    torch.save(
        obj if obj is not None else {"w": torch.arange(6, dtype=torch.float32)},
        path,
        _use_new_zipfile_serialization=False,
    )
    return path, path.read_bytes()


def _storage_header_offset(raw: bytes) -> int:
    """Where the first storage count is: after five pickles (magic, protocol, sys info, object, key list)."""
    pos = 0
    for _ in range(5):
        end = pickle_end(raw[pos:])
        assert end is not None
        pos += end
    return pos


def test_every_truncation_is_refused(tmp_path: Path) -> None:
    """Cut at any byte, the file is refused as truncated or damaged: never a traceback, never a short read."""
    _, raw = _legacy_file(tmp_path)
    cut = tmp_path / "cut.pt"
    for n in range(1, len(raw)):
        cut.write_bytes(raw[:n])
        with pytest.raises(CorruptFileError):
            load_tree(cut)


def test_a_count_that_disagrees_with_the_object_is_refused(tmp_path: Path) -> None:
    """A storage count larger or smaller than its tensors declare would shift every later storage (overlap or
    gaps): refused, naming the storage."""
    path, raw = _legacy_file(tmp_path, {"a": torch.ones(3), "b": torch.ones(3)})
    at = _storage_header_offset(raw)
    for count in (2, 4, -1):
        path.write_bytes(raw[:at] + struct.pack("<q", count) + raw[at + 8 :])
        with pytest.raises(CorruptFileError, match="elements where its tensors declare 3"):
            load_tree(path)


def test_counts_past_the_end_are_refused(tmp_path: Path) -> None:
    """An object declaring a storage larger than the file (count and id agree) runs past the end: refused,
    without reading or allocating the claimed size."""
    path, raw = _legacy_file(tmp_path)
    at = _storage_header_offset(raw)
    huge = 1 << 40
    obj_pid = pickle.dumps(6, protocol=2)[2:-1]  # BININT1 6: the numel in the persistent id
    assert raw[:at].count(obj_pid) >= 1
    big = b"\x8a\x06" + huge.to_bytes(6, "little")  # LONG1: the same number, now 2**40
    patched = raw[:at].replace(obj_pid + b"N", big + b"N", 1)
    assert patched != raw[:at]
    path.write_bytes(patched + struct.pack("<q", huge) + raw[at + 8 :])
    with pytest.raises(CorruptFileError, match="past the end of the file"):
        load_tree(path)


def test_a_key_list_that_does_not_match_the_object_is_refused(tmp_path: Path) -> None:
    """The storages are located by the key list: one missing, extra or repeated key is refused (torch would
    leave a storage uninitialised or fail with a KeyError)."""
    path, raw = _legacy_file(tmp_path)
    start = 0
    for _ in range(4):
        end = pickle_end(raw[start:])
        assert end is not None
        start += end
    end = start + (pickle_end(raw[start:]) or 0)
    keys = pickle.loads(raw[start:end])
    for bad in ([], [*keys, *keys], [*keys, "999"], "not a list"):
        path.write_bytes(raw[:start] + pickle.dumps(bad, protocol=2) + raw[end:])
        with pytest.raises(CorruptFileError):
            load_tree(path)


def test_a_pickle_that_never_ends_is_refused(tmp_path: Path) -> None:
    """A legacy head whose object pickle has no STOP and an argument length past the end: refused once the
    window reaches the end of the file, after reading the file at most about twice."""
    path, raw = _legacy_file(tmp_path)
    head = 0
    for _ in range(3):
        head += pickle_end(raw[head:]) or 0
    path.write_bytes(raw[:head] + b"\x80\x02X" + struct.pack("<I", 0xFFFFFFF0) + b"a" * 300_000)
    with pytest.raises(CorruptFileError, match="does not end inside the file"):
        load_tree(path)


def test_a_wrong_magic_number_or_big_endian_file_is_refused(tmp_path: Path) -> None:
    path, raw = _legacy_file(tmp_path)
    path.write_bytes(pickle.dumps(12345, protocol=2) + raw[pickle_end(raw) or 0 :])
    with pytest.raises(CorruptFileError, match="legacy header"):
        load_tree(path)
    second = pickle_end(raw) or 0
    third = second + (pickle_end(raw[second:]) or 0)
    fourth = third + (pickle_end(raw[third:]) or 0)
    info = pickle.loads(raw[third:fourth])
    assert info["little_endian"] is True
    big = pickle.dumps({**info, "little_endian": False}, protocol=2)
    path.write_bytes(raw[:third] + big + raw[fourth:])
    with pytest.raises(UnsupportedCheckpointError, match="big-endian"):
        load_tree(path)


class _Boom:
    def __init__(self, command: str) -> None:
        self.command = command

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.system, (self.command,))


def test_a_crafted_global_is_refused_in_the_legacy_form_too(tmp_path: Path) -> None:
    """The payload is live under plain pickle; through the legacy reader it is refused and never runs."""
    marker = tmp_path / "marker"
    payload = pickle.dumps({"x": _Boom(f"touch {marker}")}, protocol=2)
    pickle.loads(payload)
    assert marker.exists()
    marker.unlink()
    path, raw = _legacy_file(tmp_path)
    head = 0
    for _ in range(3):
        head += pickle_end(raw[head:]) or 0
    path.write_bytes(raw[:head] + payload + pickle.dumps([], protocol=2))
    with pytest.raises(UnsafePickleError):
        load_tree(path)
    assert not marker.exists()


def test_storage_view_past_its_root_is_refused(tmp_path: Path) -> None:
    """The legacy form's storage views (written by old torch) must lie inside their root storage."""
    path, raw = _legacy_file(tmp_path)
    obj_start = 0
    for _ in range(3):
        obj_start += pickle_end(raw[obj_start:]) or 0
    obj_end = obj_start + (pickle_end(raw[obj_start:]) or 0)
    obj = raw[obj_start:obj_end]
    assert obj.count(b"K\x06N") == 1  # numel 6, then view_metadata None
    for view, ok in (((0, 6), True), ((2, 5), False)):
        key = pickle.dumps("view", protocol=2)[2:-1]
        meta = (
            b"("
            + key
            + pickle.dumps(view[0], protocol=2)[2:-1]
            + pickle.dumps(view[1], protocol=2)[2:-1]
            + b"t"
        )
        path.write_bytes(raw[:obj_start] + obj.replace(b"K\x06N", b"K\x06" + meta, 1) + raw[obj_end:])
        if ok:
            ref = load_tree(path)["w"]
            assert (
                ref.storage.key == "view"
                and ref.storage.offset == _storage_header_offset(path.read_bytes()) + 8
            )
            values = np.frombuffer(_bytes_of(path.read_bytes(), ref), dtype=np.float32)
            assert values.tolist() == [0, 1, 2, 3, 4, 5]
        else:
            with pytest.raises(CorruptFileError, match="reaches past its storage"):
                load_tree(path)
