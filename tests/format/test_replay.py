"""Pickle bytes met before are rebuilt, not unpickled (format/replay.py): the rebuilt tree is the tree the
unpickling gives for that archive, and every per-archive check the unpickling made still refuses a bad record
in the same words."""

from __future__ import annotations

import argparse
import zipfile
from collections import OrderedDict
from pathlib import Path
from typing import Any

import pytest
import torch

from inspector.errors import CorruptFileError
from inspector.format import replay
from inspector.format.torchzip import SafeUnpickler, TensorRef, load
from inspector.format.zipreader import TorchZip

pytestmark = pytest.mark.usefixtures("fresh_caches")  # conftest: empty template and memo caches


def rank_file(tmp_path: Path, r: int) -> Path:
    """One 'rank' of a save: the same structure, names and shapes every time, other values."""
    g = torch.Generator().manual_seed(r)
    w = torch.randn(6, 4, generator=g)
    state = {
        "module": OrderedDict([("a.weight", w), ("b.weight", torch.zeros(0, dtype=torch.bfloat16))]),
        "tied": [w, w.t()],  # one tensor twice, and a strided view of its storage
        "flat": torch.arange(10, dtype=torch.float32)[2:],
        "param_shapes": [OrderedDict([("a.weight", torch.Size([6, 4]))])],
        "ds_config": {"zero_optimization": {"stage": 3}, "lr": 1e-3},
        "step": 7,
    }
    path = tmp_path / f"rank_{r}.pt"
    torch.save(state, path)
    return path


def unpickled(path: Path) -> Any:
    """The tree as the restricted unpickler gives it for this archive (no cache involved)."""
    archive = TorchZip(str(path))
    try:
        return SafeUnpickler(archive.read_entry(f"{archive.prefix}data.pkl"), archive).load()
    finally:
        archive.close()


def loaded(path: Path) -> Any:
    tree, archive = load(str(path))
    archive.close()
    return tree


def test_a_pickle_met_again_is_rebuilt_into_the_tree_unpickling_gives(tmp_path: Path) -> None:
    paths = [rank_file(tmp_path, r) for r in range(4)]
    trees = [loaded(p) for p in paths]
    assert len(replay._TEMPLATES) == 1 and next(iter(replay._TEMPLATES.values())) is not None
    for p, tree in zip(paths, trees, strict=True):
        assert tree == unpickled(p)
        assert tree["module"]["a.weight"].path == str(p)
        assert tree["tied"][0] is tree["module"]["a.weight"]  # shared in the pickle, shared in the tree
        want = torch.load(p, weights_only=True)
        ref: TensorRef = tree["flat"]
        raw = p.read_bytes()[ref.offset : ref.offset + ref.nbytes]
        assert torch.equal(torch.frombuffer(bytearray(raw), dtype=torch.float32), want["flat"])
    # the two later ranks' trees point at their own files, never at the template's
    assert trees[3]["tied"][1].storage.path == str(paths[3])


def with_short_record(src: Path, dst: Path, member: str) -> None:
    """`src` rewritten with one storage record cut short; data.pkl (and so its bytes) unchanged."""
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w", zipfile.ZIP_STORED) as zout:
        for info in zin.infolist():
            data = zin.read(info)
            if info.filename.endswith(member):
                data = data[: len(data) // 2]
            zout.writestr(info.filename.replace(src.stem, dst.stem), data)


def test_a_short_record_is_refused_in_the_words_unpickling_uses(tmp_path: Path) -> None:
    good = [rank_file(tmp_path, r) for r in range(3)]
    bad = tmp_path / "rank_9.pt"
    with_short_record(good[0], bad, "data/0")
    with pytest.raises(CorruptFileError) as unpickling:
        unpickled(bad)
    for p in good:
        loaded(p)
    assert next(iter(replay._TEMPLATES.values())) is not None
    with pytest.raises(CorruptFileError) as rebuilt:
        loaded(bad)
    assert rebuilt.value.message == unpickling.value.message
    assert "should hold" in rebuilt.value.message


def test_a_tensor_inside_a_record_gets_no_template_and_is_unpickled(tmp_path: Path) -> None:
    """Where a rebuild would not reach a tensor (inside an inert record), the tree is unpickled every time."""
    paths = []
    for r in range(3):
        path = tmp_path / f"ns_{r}.pt"
        torch.save({"args": argparse.Namespace(scale=torch.full((3,), float(r))), "t": torch.ones(2)}, path)
        paths.append(path)
    trees = [loaded(p) for p in paths]
    assert list(replay._TEMPLATES.values()) == [None]
    for p, tree in zip(paths, trees, strict=True):
        assert tree["args"].get("scale").path == str(p)
        assert tree["t"] == unpickled(p)["t"]


def test_the_templates_kept_are_bounded_in_count_and_bytes() -> None:
    """Templates keep their trees alive for the process: at most a few, of a bounded pickle size in all."""

    class NoStorages:
        def storages(self) -> dict[str, Any]:
            return {}

    for i in range(40):
        replay.learn(bytes([i]) * (200 << 10), {"i": i}, NoStorages())  # type: ignore[arg-type]
        assert len(replay._TEMPLATES) <= replay._TEMPLATES_MAX
        assert sum(map(len, replay._TEMPLATES)) <= replay._TEMPLATES_BYTES
    replay.learn(b"x" * (replay._TEMPLATE_MAX_BYTES + 1), {}, NoStorages())  # type: ignore[arg-type]
    assert all(len(k) <= replay._TEMPLATE_MAX_BYTES for k in replay._TEMPLATES)
    assert replay.template_for(bytes([39]) * (200 << 10)) is not None


def test_a_template_is_found_by_its_bytes_never_by_its_crc_alone() -> None:
    """Templates are indexed by length and CRC-32 (no hash of the pickle's bytes a file), and taken only
    where the bytes are equal: other bytes of that length and CRC-32 (a collision is easy to craft) get none,
    and are not kept in place of the first."""

    class NoStorages:
        def storages(self) -> dict[str, Any]:
            return {}

    first, other = b"a" * 64, b"b" * 64
    replay.learn(first, {"k": 1}, NoStorages(), crc=1234)  # type: ignore[arg-type]
    assert replay.template_for(first, 1234) is not None
    assert replay.template_for(other, 1234) is None
    assert replay.template_for(first, 4321) is None
    replay.learn(other, {"k": 2}, NoStorages(), crc=1234)  # type: ignore[arg-type]
    assert replay.template_for(other, 1234) is None and replay.template_for(first, 1234) is not None
    assert replay.seen(64, 1234) == first


@pytest.mark.parametrize("damage", ["bytes", "crc"])
def test_a_pickle_a_template_holds_is_still_checked_against_its_crc(tmp_path: Path, damage: str) -> None:
    """A rank file whose pickle bytes equal a template's skips summing its CRC-32 only where its directory
    gives the same CRC-32: a damaged pickle, or a CRC-32 field that no longer matches, is refused."""
    paths = [rank_file(tmp_path, r) for r in range(4)]
    for p in paths[:3]:
        loaded(p)
    with zipfile.ZipFile(paths[3]) as z:
        info = next(i for i in z.infolist() if i.filename.endswith("data.pkl"))
    raw = bytearray(paths[3].read_bytes())
    if damage == "bytes":
        at = info.header_offset + 30 + len(info.filename.encode()) + len(info.extra)
        raw[at + info.file_size // 2] ^= 0x01
    else:
        cd = raw.rindex(b"PK\x01\x02", 0, raw.rindex(info.filename.encode()))
        raw[cd + 16] ^= 0x01
    paths[3].write_bytes(bytes(raw))
    with pytest.raises(CorruptFileError, match="CRC-32"):
        loaded(paths[3])
