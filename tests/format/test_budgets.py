"""Costs bounded by the file, checked once where every archive is loaded: pickle allocations, nesting,
shared sub-trees, tensor views, and the zip container's own fields. Each case is a real torch-style archive
that the previous reader took seconds, gigabytes or a traceback on; here it is refused fast and small."""

from __future__ import annotations

import pickle
import struct
import tracemalloc
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from inspector.convert.reader import read_ref
from inspector.errors import InspectorError
from inspector.format.torchzip import load_tree


def write_pt(path: Path, pkl: bytes, records: dict[str, bytes] | None = None, arc: str | None = None) -> Path:
    arc = arc or path.name.removesuffix(".pt")
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as z:
        z.writestr(f"{arc}/data.pkl", pkl)
        z.writestr(f"{arc}/byteorder", "little")
        for key, data in (records or {}).items():
            z.writestr(f"{arc}/data/{key}", data)
        z.writestr(f"{arc}/version", "3\n")
    return path


def refused_small(path: Path, needle: str, ceiling: int = 64 << 20) -> None:
    """Refused with the one error kind, naming why, allocating less than `ceiling` on the way."""
    tracemalloc.start()
    try:
        with pytest.raises(InspectorError, match=needle):
            load_tree(path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < ceiling, f"{peak >> 20} MiB allocated before refusing"


@pytest.mark.slow  # a pickle big enough to matter, unpickled up to its refusal: tox -e slow
def test_a_pickle_of_empty_sets_is_refused_before_it_allocates(tmp_path: Path) -> None:
    """9.6 MB of EMPTY_SET built 2.3 GB of sets; the opcode walk charges each one and refuses first."""
    pkl = pickle.PROTO + b"\x02" + b"\x8f" * 9_600_000 + pickle.STOP
    refused_small(write_pt(tmp_path / "sets.pt", pkl), "would need over", ceiling=32 << 20)


def test_nesting_past_the_bound_is_refused(tmp_path: Path) -> None:
    """3000 levels overflowed the stack of a later walker; refused at load, before any walker runs."""
    pkl = pickle.PROTO + b"\x02" + pickle.EMPTY_LIST * 3000 + pickle.APPEND * 2999 + pickle.STOP
    refused_small(write_pt(tmp_path / "deep.pt", pkl), "levels deep")


def test_shared_sub_trees_are_refused_by_their_expanded_size(tmp_path: Path) -> None:
    """l(i+1) = [l(i), l(i)] forty times: 2^40 paths from a few hundred bytes."""
    tree: list[object] = [1]
    for _ in range(40):
        tree = [tree, tree]
    refused_small(write_pt(tmp_path / "shared.pt", pickle.dumps(tree, protocol=2)), "shared sub-trees")


def test_real_sharing_is_accepted(tmp_path: Path) -> None:
    """A tuple shared by every param group (betas) is normal: small multiplicity passes."""
    betas = (0.9, 0.999)
    tree = {"param_groups": [{"betas": betas, "lr": 1e-3} for _ in range(64)]}
    assert load_tree(write_pt(tmp_path / "ok.pt", pickle.dumps(tree, protocol=2))) == tree


def test_an_expanded_buffer_is_refused_not_enumerated(tmp_path: Path) -> None:
    """`zeros(1).expand(10**8)` (stride 0) made one Segment per element; refused from its shape alone."""
    path = tmp_path / "expand.pt"
    torch.save({"buf": torch.zeros(1).expand(10**8)}, path)
    refused_small(path, "expanded view", ceiling=16 << 20)


def test_ordinary_views_still_read_exactly(tmp_path: Path) -> None:
    """Broadcast rows, a transpose and HF's position_ids shape (1, N) keep loading, values exact."""
    path = tmp_path / "views.pt"
    want = {
        "rows": torch.arange(8.0).expand(4, 8),
        "t": torch.arange(12.0).reshape(3, 4).t(),
        "pos": torch.arange(512).expand((1, -1)),
    }
    torch.save(want, path)
    tree = load_tree(path)
    for name, t in want.items():
        assert np.array_equal(read_ref(tree[name]), t.numpy()), name


# --- the zip container ------------------------------------------------------------------------------------


@pytest.fixture
def archive(tmp_path: Path) -> Path:
    path = tmp_path / "a.pt"
    torch.save({"w": torch.arange(6.0).reshape(2, 3), "step": 3}, path)
    return path


def test_a_comment_holding_an_end_record_is_not_taken_for_it(archive: Path) -> None:
    """The real end record is the one whose comment runs to the end of the file."""
    with zipfile.ZipFile(archive, "a") as z:
        z.comment = b"PK\x05\x06" + b"\0" * 18
    assert load_tree(archive)["step"] == 3


def _patch_eocd(path: Path, field: int, value: int, fmt: str = "<L") -> None:
    raw = bytearray(path.read_bytes())
    pos = raw.rfind(b"PK\x05\x06")
    struct.pack_into(fmt, raw, pos + field, value)
    locator = raw.rfind(b"PK\x06\x07")
    if locator >= 0:  # torch writes a zip64 end record: drop its locator so the classic record is read
        raw[locator : locator + 4] = b"XXXX"
    path.write_bytes(bytes(raw))


def test_a_directory_size_covering_the_file_is_refused_unread(archive: Path) -> None:
    _patch_eocd(archive, 12, archive.stat().st_size - 1)  # directory size
    refused_small(archive, "end-of-directory|central directory", ceiling=8 << 20)


def test_an_entry_count_beyond_the_directory_is_refused(archive: Path) -> None:
    _patch_eocd(archive, 10, 0xFFFF, "<H")  # total entries
    refused_small(archive, "disagree|central directory")


def test_duplicate_entries_and_mixed_folders_are_refused(tmp_path: Path) -> None:
    pkl = pickle.dumps({"a": 1}, protocol=2)
    mixed = tmp_path / "mixed.pt"
    with zipfile.ZipFile(mixed, "w", zipfile.ZIP_STORED) as z:
        z.writestr("mixed/data.pkl", pkl)
        z.writestr("other/data/0", b"\0" * 8)
    refused_small(mixed, "two folders")
    dup = tmp_path / "dup.pt"
    with zipfile.ZipFile(dup, "w", zipfile.ZIP_STORED) as z:
        z.writestr("dup/data.pkl", pkl)
        z.writestr("dup/version", "3\n")
        z.writestr("dup/version", "3\n")
    refused_small(dup, "same name")


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_byte_mutations_end_in_a_tree_or_the_one_error(tmp_path: Path, data: st.DataObject) -> None:
    """Any byte of a real archive overwritten (header, pickle, directory, end records) or the file cut:
    the reader returns a tree or raises an InspectorError; never another exception, never a big allocation."""
    path = tmp_path / "m.pt"
    torch.save({"w": torch.arange(6.0).reshape(2, 3), "names": ["a", "b"], "n": 3}, path)
    raw = bytearray(path.read_bytes())
    for _ in range(data.draw(st.integers(1, 4))):
        where = data.draw(st.integers(0, len(raw) - 1))
        raw[where] = data.draw(st.integers(0, 255))
    if data.draw(st.booleans()):
        raw = raw[: data.draw(st.integers(0, len(raw)))]
    path.write_bytes(bytes(raw))
    tracemalloc.start()
    try:
        load_tree(path)
    except InspectorError:
        pass
    finally:
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    assert peak < 64 << 20
