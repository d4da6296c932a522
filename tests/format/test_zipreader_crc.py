"""A whole zip member (a pickle, the byte order) is proven by the CRC-32 the zip directory holds for it:
bytes that are not the member's, from a damaged disk or a store answering another range, are refused
before the pickle reader sees them. Real `torch.save` files (CRC in the data descriptor and the central
directory, 0 in the local header) pass."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from inspector.errors import CorruptFileError
from inspector.format.torchzip import load_tree
from inspector.format.zipreader import TorchZip


def _saved(tmp_path: Path) -> Path:
    path = tmp_path / "real.pt"
    torch.save({"w": torch.arange(6, dtype=torch.float32), "step": 3, "name": "layer"}, path)
    return path


def test_a_real_torch_save_file_passes_its_crc_checks(tmp_path: Path) -> None:
    path = _saved(tmp_path)
    with TorchZip(path) as z:
        assert all(e.crc != 0 for e in z.entries.values() if e.size)
        assert z.read_entry(f"{z.prefix}data.pkl")
    assert set(load_tree(path)) == {"w", "step", "name"}


def test_a_pickle_whose_bytes_differ_from_its_crc_is_refused(tmp_path: Path) -> None:
    path = _saved(tmp_path)
    with TorchZip(path) as z:
        name = f"{z.prefix}data.pkl"
        at = z.data_offset(name) + z.entries[name].size - 2  # inside the pickle, before its STOP
    raw = bytearray(path.read_bytes())
    raw[at] ^= 0x01  # one bit: a length check or the pickle reader alone might not see it
    path.write_bytes(bytes(raw))
    with pytest.raises(CorruptFileError, match="CRC-32"):
        load_tree(path)


def test_a_zip_directory_above_the_bound_is_refused_as_too_many_records(tmp_path: Path) -> None:
    """A directory of about a million storages (70 MB) is refused by its size, named as such (it was called
    damaged before). The file is sparse: the bound is checked before the directory is read."""
    import struct

    from inspector.errors import UnsupportedCheckpointError

    cd_size, cd_off = 70 << 20, 30
    path = tmp_path / "fragmented.pt"
    with path.open("wb") as f:
        f.write(b"PK\x03\x04" + bytes(26))
        f.seek(cd_off + cd_size)
        f.write(b"PK\x05\x06" + struct.pack("<4H2LH", 0, 0, 60_000, 60_000, cd_size, cd_off, 0))
    with pytest.raises(UnsupportedCheckpointError, match="above the 64 MiB"):
        TorchZip(path)
