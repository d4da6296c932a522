"""A big save's zip directories read in bulk (`format/zipdir.py`) give exactly what the record-by-record loop
gives: the same entries in the same order, the same bounds and prefix, and, for any damage, the loop's own
refusal in its own words (the bulk read never refuses; it hands anything unusual back to the loop)."""

from __future__ import annotations

import random
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from inspector.errors import InspectorError
from inspector.format import zipdir
from inspector.format.zipreader import TorchZip

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


@pytest.fixture
def bulk(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Every directory read in bulk where the plain shape holds (the loop otherwise)."""
    monkeypatch.setattr(zipdir, "BULK_RECORDS", 0)
    monkeypatch.setattr(zipdir, "AFTER", -1)
    yield


def outcome(path: Path, bulk: bool, monkeypatch: pytest.MonkeyPatch) -> Any:
    """What opening the archive gives: its entries (in order), bounds and prefix, or the refusal's words."""
    monkeypatch.setattr(zipdir, "BULK_RECORDS", 0 if bulk else 1 << 30)
    monkeypatch.setattr(zipdir, "AFTER", -1)
    try:
        with TorchZip(str(path)) as z:
            return list(z.entries.items()), z._bounds, z.prefix
    except InspectorError as exc:
        return type(exc).__name__, exc.message, exc.hint


def big_save(tmp_path: Path, n: int = 300) -> Path:
    """A stage-3 model-states file's shape: a record per parameter placeholder, and a few real tensors."""
    state: dict[str, Any] = {f"layers.{i}.weight": torch.empty(0, dtype=torch.bfloat16) for i in range(n)}
    state.update({f"norm.{i}": torch.full((i + 1,), float(i)) for i in range(5)})
    path = tmp_path / "zero_pp_rank_3_mp_rank_00_model_states.pt"
    torch.save(state, path)
    return path


def test_a_big_saves_directory_is_read_in_bulk(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = big_save(tmp_path)
    seen: list[Any] = []
    real = zipdir.read
    monkeypatch.setattr(zipdir, "read", lambda *a: seen.append(real(*a)) or seen[-1])
    bulk = outcome(path, True, monkeypatch)
    assert len(seen) == 1 and seen[0] is not None  # the bulk read answered, not the loop
    assert bulk == outcome(path, False, monkeypatch)
    assert len(bulk[0]) > 300


def test_every_fixture_archive_reads_alike(monkeypatch: pytest.MonkeyPatch) -> None:
    files = sorted(p for p in FIXTURES.rglob("*.pt") if zipfile.is_zipfile(p))
    assert len(files) > 100
    for path in files:
        assert outcome(path, True, monkeypatch) == outcome(path, False, monkeypatch), path


def test_every_damaged_directory_byte_gets_the_loops_answer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Single bytes of the directory changed (every byte of its first two records and of its last, and
    800 others): whatever the loop makes of each, the bulk read makes the same."""
    raw = big_save(tmp_path, 120).read_bytes()
    cd_off = int.from_bytes(raw[raw.rfind(b"PK\x05\x06") + 16 :][:4], "little")
    cd_end = raw.rfind(b"PK\x05\x06")
    rng = random.Random(43)
    spots = [*range(cd_off, cd_off + 2 * 46 + 80), *range(cd_end - 120, cd_end)]
    spots += rng.sample(range(cd_off, cd_end), 800)
    damaged = tmp_path / "damaged.pt"
    outcomes = set()
    for at in spots:
        for value in (raw[at] ^ 0xFF, rng.randrange(256)):
            if value == raw[at]:
                continue
            damaged.write_bytes(raw[:at] + bytes([value]) + raw[at + 1 :])
            loop = outcome(damaged, False, monkeypatch)
            assert outcome(damaged, True, monkeypatch) == loop, (at, value)
            outcomes.add(loop[0] if isinstance(loop[0], str) else "read")
    assert {"read", "CorruptFileError"} <= outcomes  # both kinds of answer were met


def test_a_name_holding_the_signature_is_left_to_the_loop(tmp_path: Path, bulk: None) -> None:
    path = tmp_path / "odd.pt"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as z:
        z.writestr("a/data.pkl", b"\x80\x02}q\x00.")
        z.writestr("a/byteorder", b"little")
        for i in range(300):
            z.writestr(f"a/data/{i}", b"")
        z.writestr("a/data/PK\x01\x02", b"")
    cd = path.read_bytes()
    cd_off = int.from_bytes(cd[cd.rfind(b"PK\x05\x06") + 16 :][:4], "little")
    assert zipdir.read(cd[cd_off : cd.rfind(b"PK\x05\x06")], 303, cd_off, len(cd)) is None
    with TorchZip(str(path)) as z:  # the loop read it
        assert "a/data/PK\x01\x02" in z.entries and len(z.entries) == 303


def test_small_directories_and_the_first_big_ones_take_the_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    """numpy is imported for bulk reads only once a process has met AFTER big directories (or has numpy)."""
    import sys

    monkeypatch.setattr(zipdir, "_met", 0)
    assert not zipdir.wanted(zipdir.BULK_RECORDS - 1)
    assert zipdir.wanted(zipdir.BULK_RECORDS) is ("numpy" in sys.modules or zipdir.AFTER < 1)
    monkeypatch.delitem(sys.modules, "numpy")
    monkeypatch.setattr(zipdir, "_met", 0)
    said = [zipdir.wanted(zipdir.BULK_RECORDS) for _ in range(zipdir.AFTER + 2)]
    assert said == [False] * zipdir.AFTER + [True, True]
