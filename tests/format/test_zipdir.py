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
    monkeypatch.setattr(zipdir, "AFTER", 0)
    yield


def outcome(path: Path, bulk: bool, monkeypatch: pytest.MonkeyPatch) -> Any:
    """What opening the archive gives: its entries (in order), bounds and prefix, or the refusal's words."""
    monkeypatch.setattr(zipdir, "BULK_RECORDS", 0 if bulk else 1 << 30)
    monkeypatch.setattr(zipdir, "AFTER", 0)
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


def zip64_save(tmp_path: Path, n: int = 300) -> Path:
    """The same shape written by our own writer (`ptwriter`), which gives every record torch's zip64 extra
    (all three sizes, id 1 first): the demo's rank files."""
    import numpy as np

    from inspector.format import ptwriter as pw

    values = np.arange(40, dtype=np.float32)
    tree: dict[str, Any] = {f"layers.{i}.weight": pw.Tensor(pw.Storage("bfloat16", 0), (0,)) for i in range(n)}
    tree["norm"] = pw.Tensor(pw.Storage("float32", 40, lambda s, k: values[s : s + k]), (40,))
    path = tmp_path / "zero_pp_rank_1_mp_rank_00_model_states.pt"
    with path.open("wb") as fh:
        pw.dump(tree, fh, path.stem)
    return path


def test_torchs_zip64_form_is_read_in_bulk_and_damage_to_it_left_to_the_loop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = zip64_save(tmp_path)
    raw = path.read_bytes()
    with zipfile.ZipFile(path) as z:
        assert all(len(i.extra) >= 28 for i in z.infolist())  # every record zip64
    loop = outcome(path, False, monkeypatch)
    assert outcome(path, True, monkeypatch) == loop and len(loop[0]) > 300
    seen: list[Any] = []
    real = zipdir.read
    monkeypatch.setattr(zipdir, "read", lambda *a: seen.append(real(*a)) or seen[-1])
    outcome(path, True, monkeypatch)
    assert seen and seen[0] is not None  # the bulk read answered
    monkeypatch.setattr(zipdir, "read", real)
    cd = raw.find(b"PK\x01\x02")
    rng = random.Random(64)
    damaged = tmp_path / "damaged.pt"
    for at in [*range(cd, cd + 2 * (46 + 80)), *rng.sample(range(cd, raw.rfind(b"PK\x06\x06")), 500)]:
        damaged.write_bytes(raw[:at] + bytes([raw[at] ^ (1 << rng.randrange(8))]) + raw[at + 1 :])
        assert outcome(damaged, True, monkeypatch) == outcome(damaged, False, monkeypatch), at


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
    """numpy is imported for bulk reads only once the loop has read AFTER records of big directories in this
    process (or numpy is imported already)."""
    import sys

    monkeypatch.setattr(zipdir, "_looped", 0)
    assert not zipdir.wanted(zipdir.BULK_RECORDS - 1)
    assert zipdir.wanted(zipdir.BULK_RECORDS)  # numpy is imported here (torch imports it)
    monkeypatch.delitem(sys.modules, "numpy")
    big = 1000
    said = [zipdir.wanted(big) for _ in range(zipdir.AFTER // big + 2)]
    assert said == [False] * (zipdir.AFTER // big) + [True, True]


def requests_of(path: Path) -> list[tuple[str, str, int]]:
    """The storages a pickle of this file asks for, in its order: (key, dtype, elements)."""
    from inspector.format.torchzip import load

    _, archive = load(str(path))
    with archive:
        return [(k, s.dtype, s.nbytes // {"bfloat16": 2, "float32": 4}[s.dtype]) for k, s in archive.storages().items()]


def checked(path: Path, requests: list[tuple[str, str, int]], wanted: set[str] | None, bulk: bool) -> Any:
    """`storages_for` of `requests` in the archive at `path` (bulk or one by one): the wanted refs (the loop
    also hands back some others it made on the way, which nobody reads) or the refusal's words."""
    saved = zipdir.BULK_RECORDS
    zipdir.BULK_RECORDS = 0 if bulk else 1 << 30
    try:
        with TorchZip(str(path)) as z:
            refs = z.storages_for(requests, wanted)
            return {k: v for k, v in refs.items() if wanted is None or k in wanted}
    except InspectorError as exc:
        return type(exc).__name__, exc.message, exc.hint
    finally:
        zipdir.BULK_RECORDS = saved


def test_every_damaged_local_header_byte_gets_the_loops_storage_answer(tmp_path: Path) -> None:
    """A big archive's storages checked at once (`zipdir.storages`) give what `storages_for`'s loop gives,
    refs or refusal, for single bytes changed across the local headers (every byte of the first three
    headers and 600 others), all refs made or only the few wanted."""
    path = big_save(tmp_path, 120)
    raw = path.read_bytes()
    requests = requests_of(path)
    assert len(requests) > 120
    wanted = {requests[-1][0], requests[3][0]}
    first = raw.find(b"PK\x03\x04", raw.find(b"data/0"))
    cd_off = int.from_bytes(raw[raw.rfind(b"PK\x05\x06") + 16 :][:4], "little")
    rng = random.Random(7)
    spots = [*range(first - 200, first + 400), *rng.sample(range(first, cd_off), 600)]
    damaged = tmp_path / "damaged.pt"
    seen = set()
    assert checked(path, requests, None, True) == checked(path, requests, None, False)
    for at in spots:
        value = raw[at] ^ (1 << rng.randrange(8))
        damaged.write_bytes(raw[:at] + bytes([value]) + raw[at + 1 :])
        for want in (None, wanted):
            loop = checked(damaged, requests, want, False)
            assert checked(damaged, requests, want, True) == loop, (at, value, want)
            seen.add(loop[0] if isinstance(loop, tuple) else "refs")
    assert {"refs", "CorruptFileError"} <= seen
    # a short record, a dtype the table lacks and a key asked twice: the loop's answers
    for odd in ([(k, d, n + 1) for k, d, n in requests], [(*requests[0][:1], "complex32", 1), *requests[1:]],
                [requests[0], *requests]):  # fmt: skip
        assert checked(path, odd, None, True) == checked(path, odd, None, False)


def test_a_big_archives_storages_are_checked_in_one_read(tmp_path: Path, bulk: None) -> None:
    path = big_save(tmp_path, 300)
    requests = requests_of(path)
    with TorchZip(str(path)) as z:
        real = z.handle.pread
        calls: list[int] = []
        z.handle.pread = lambda n, off: calls.append(n) or real(n, off)  # type: ignore[method-assign]
        refs = z.storages_for(requests, None)
    assert len(refs) == len(requests) > 300 and len(calls) == 1
