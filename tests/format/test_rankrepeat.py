"""A rank file that repeats an earlier rank's archive under its own name (`format/rankrepeat.py`): its
directory's answer and its storages' verdicts taken from that archive only where every byte a check reads is
the same but for the name prefix (and the CRC-32s and record bytes no check reads). The scan is the one that
reads every file in full; damage anywhere compared goes to the full read and is refused in its own words,
naming the file's own records; a record read whole is checked against the file's own CRC-32."""

from __future__ import annotations

import struct
import zipfile
from pathlib import Path
from typing import Any

import pytest

from inspector.demo.writer import DemoSpec
from inspector.format import rankrepeat, replay
from inspector.format.torchzip import load
from inspector.scan.scanner import scan

SPEC = DemoSpec(stage=3, world_size=16, dtype="bf16", params=60_000)  # 2-digit ranks from 10 on
# partitions of 400 KB: an optimizer file's records lie further apart than one span may mask
FAR = DemoSpec(stage=3, world_size=8, dtype="bf16", params=800_000)
# 40 layers: model-states files of ~400 records, past torchzip.WHOLE_FILE (`rankrepeat.whole` reads them whole)
DEEP = DemoSpec(stage=3, world_size=16, dtype="bf16", params=800_000, layers=40)


pytestmark = pytest.mark.usefixtures("fresh_format_caches")


def _counting(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    counts = {"adopted": 0, "storages": 0, "optimizer storages": 0}
    adopt, storages = rankrepeat.adopt, rankrepeat.storages

    def adopting(*a: Any) -> Any:
        lay = adopt(*a)
        counts["adopted"] += lay is not None
        return lay

    def checking(archive: Any, *a: Any) -> Any:
        refs = storages(archive, *a)
        counts["storages"] += refs is not None
        counts["optimizer storages"] += refs is not None and "optim_states" in archive.path
        return refs

    monkeypatch.setattr(rankrepeat, "adopt", adopting)
    monkeypatch.setattr(rankrepeat, "storages", checking)
    return counts


def test_a_save_scans_as_when_every_file_is_read_in_full(demo: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    root = demo(SPEC)
    counts = _counting(monkeypatch)
    fast = scan(str(root))
    assert counts["adopted"] >= SPEC.world_size and counts["storages"] >= SPEC.world_size // 2, counts
    replay.forget()
    rankrepeat._LAYOUTS.clear()
    monkeypatch.setattr(rankrepeat, "_MAX_LAYOUTS", 0)  # nothing learnt: every archive read in full
    full = scan(str(root))
    assert counts["adopted"] < 2 * SPEC.world_size  # none more in the second scan
    assert fast == full and not fast.errors


def _tag(root: Path) -> Path:
    return next(p for p in root.iterdir() if p.is_dir())


def _member(path: Path, suffix: str) -> zipfile.ZipInfo:
    with zipfile.ZipFile(path) as z:
        return next(i for i in z.infolist() if i.filename.endswith(suffix))


def _poke(path: Path, at: int, data: bytes) -> None:
    with path.open("r+b") as fh:
        fh.seek(at)
        fh.write(data)


def _directory_record(path: Path, suffix: str) -> int:
    """The offset of `suffix`'s central directory record."""
    raw = path.read_bytes()
    name = _member(path, suffix).filename.encode()
    return raw.rindex(b"PK\x01\x02", 0, raw.rindex(name)) if raw.count(name) > 1 else -1


def test_an_optimizer_files_far_apart_headers_are_each_compared(
    demo: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An optimizer file's partitions lie hundreds of KB apart: each local header is compared in a span of
    its own, and the scan is the one that reads every file in full."""
    root = demo(FAR)
    counts = _counting(monkeypatch)
    fast = scan(str(root))
    assert counts["optimizer storages"] >= FAR.world_size // 2, counts
    replay.forget()
    rankrepeat._LAYOUTS.clear()
    monkeypatch.setattr(rankrepeat, "_MAX_LAYOUTS", 0)
    assert fast == scan(str(root)) and not fast.errors


def test_an_optimizer_files_far_header_damaged_is_refused_as_in_a_full_read(
    demo: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A late rank's optimizer file whose last partition's local header (far from the others, a span of its
    own) is damaged: the same refusal as when every file is read in full, in that file's own names."""
    root = demo.copy(FAR, tmp_path / "ckpt")
    path = _tag(root) / "bf16_zero_pp_rank_6_mp_rank_00_optim_states.pt"
    with zipfile.ZipFile(path) as z:
        last = max((i for i in z.infolist() if "/data/" in i.filename), key=lambda i: i.header_offset)
    _poke(path, last.header_offset + 26, struct.pack("<H", 0xF000))
    found = [(f.code, f.file, f.message) for f in scan(str(root)).errors]
    replay.forget()
    rankrepeat._LAYOUTS.clear()
    monkeypatch.setattr(rankrepeat, "_MAX_LAYOUTS", 0)
    assert found == [(f.code, f.file, f.message) for f in scan(str(root)).errors]
    assert [f for code, f, _ in found if code == "unreadable"] == [str(path)], found
    assert not any(f"rank_{r}_mp" in m for r in range(6) for _, _, m in found), found


@pytest.mark.parametrize(
    "damage",
    ["local header", "local lengths", "directory offset", "directory size", "directory name", "pickle byte"],
)
@pytest.mark.parametrize("spec", [SPEC, DEEP], ids=["small", "read whole"])
def test_damage_where_a_check_reads_is_refused_as_in_a_full_read(
    demo: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, damage: str, spec: DemoSpec
) -> None:
    """A late rank's model-states file damaged in a byte some check reads: the same refusal, naming the
    same file, as when every file is read in full; the message names that file's own record. Also where
    the file is read whole by its first read (`rankrepeat.whole`): what is checked is the same."""
    root = demo.copy(spec, tmp_path / "ckpt")
    path = _tag(root) / "zero_pp_rank_13_mp_rank_00_model_states.pt"
    info = _member(path, "/data/3")
    cd = _directory_record(path, "/data/3")
    if damage == "local header":
        _poke(path, info.header_offset, b"\0\0\0\0")
    elif damage == "local lengths":
        _poke(path, info.header_offset + 28, struct.pack("<H", 0xF000))
    elif damage == "directory offset":
        _poke(path, cd + 42, struct.pack("<L", info.header_offset + 3))
    elif damage == "directory size":
        _poke(path, cd + 20, struct.pack("<LL", 1 << 20, 1 << 20))
    elif damage == "pickle byte":  # the same length, its CRC-32 in the directory no longer its bytes'
        pkl = _member(path, "data.pkl")
        nlen, xlen = struct.unpack_from("<HH", path.read_bytes(), pkl.header_offset + 26)
        at = pkl.header_offset + 30 + nlen + xlen + pkl.file_size // 2
        _poke(path, at, bytes([path.read_bytes()[at] ^ 0x01]))
    else:  # a name no longer under the file's prefix
        _poke(path, cd + 46, b"X")
    found = [(f.code, f.file, f.message) for f in scan(str(root)).errors]
    replay.forget()
    rankrepeat._LAYOUTS.clear()
    monkeypatch.setattr(rankrepeat, "_MAX_LAYOUTS", 0)
    assert found == [(f.code, f.file, f.message) for f in scan(str(root)).errors]
    unreadable = [m for code, f, m in found if code == "unreadable"]
    assert [f for code, f, _ in found if code == "unreadable"] == [str(path)], found
    assert not any(f"rank_{r}_mp" in unreadable[0] for r in range(13)), unreadable[0]  # its own names


def test_a_file_mostly_read_by_a_repeat_is_read_whole_by_its_first_read(
    demo: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stage-3 model-states file past WHOLE_FILE that repeats a learnt one is mostly directory, pickle and
    local headers: once a file of its size was learnt, the next is read in one call of its whole size (one
    request from a bucket, where it took five), and the scan is the one that reads every file in full. An
    optimizer file, mostly partitions no check reads, is still read a page first."""
    from inspector.format import torchzip
    from inspector.system.source import LocalHandle

    root = demo(DEEP)
    sizes = {p.name: p.stat().st_size for p in _tag(root).iterdir()}
    assert min(s for n, s in sizes.items() if "states" in n) > torchzip.WHOLE_FILE
    first: dict[str, tuple[int, int]] = {}
    real = LocalHandle.pread

    def reading(h: Any, n: int, off: int) -> bytes:
        first.setdefault(Path(h.path).name, (n, off))
        return real(h, n, off)

    monkeypatch.setattr(LocalHandle, "pread", reading)
    fast = scan(str(root))
    whole = sorted(name for name, call in first.items() if call == (sizes.get(name), 0))
    late = {f"zero_pp_rank_{r}_mp_rank_00_model_states.pt" for r in (5, 6, 7, 8, 9, 13, 14, 15)}  # learnt by then
    assert late <= set(whole), whole
    assert not any("optim_states" in n for n in whole), whole
    replay.forget()
    rankrepeat._LAYOUTS.clear()
    monkeypatch.setattr(rankrepeat, "_MAX_LAYOUTS", 0)
    first.clear()
    full = scan(str(root))
    assert not any(call == (sizes.get(name), 0) for name, call in first.items() if "model_states" in name)
    assert fast == full and not fast.errors


def test_a_record_read_whole_is_checked_against_the_files_own_crc(demo: Any, tmp_path: Path) -> None:
    """A repeat takes the learnt entries, whose CRC-32s of records holding bytes are another rank's: a record
    read whole is checked against this file's own CRC-32 (its bytes pass; damaged bytes are refused)."""
    root = demo.copy(SPEC, tmp_path / "ckpt")
    tag = _tag(root)
    paths = [tag / f"zero_pp_rank_{r}_mp_rank_00_model_states.pt" for r in range(10, 16)]
    for p in paths[:-1]:  # the pickle met, then its template, then the layout learnt
        _, archive = load(str(p), skip=frozenset({"module"}))
        archive.close()
    assert rankrepeat._LAYOUTS
    last = paths[-1]
    _, archive = load(str(last), skip=frozenset({"module"}))
    try:
        lay = archive.repeats
        assert lay is not None and lay.crc_of, "the last file must be taken as a repeat, some record with bytes"
        name = next(iter(lay.crc_of))
        suffix = name[len(archive.prefix) :]
        with zipfile.ZipFile(last) as z:
            own = z.read(archive.own_prefix + suffix)
        assert archive.read_entry(name) == own
    finally:
        archive.close()
    info = _member(last, suffix)
    raw = bytearray(last.read_bytes())
    nlen, xlen = struct.unpack_from("<HH", raw, info.header_offset + 26)  # the local header's own lengths
    start = info.header_offset + 30 + nlen + xlen
    raw[start] ^= 0xFF  # the record's own bytes, which no directory comparison reads
    last.write_bytes(bytes(raw))
    _, archive = load(str(last), skip=frozenset({"module"}))
    try:
        assert archive.repeats is not None
        with pytest.raises(Exception, match="CRC-32"):
            archive.read_entry(name)
    finally:
        archive.close()


def test_a_prefix_of_another_shape_is_not_taken(demo: Any, tmp_path: Path) -> None:
    """A file whose names sit under a prefix of another shape (a second "/") is read in full."""
    root = demo.copy(SPEC, tmp_path / "ckpt")
    tag = _tag(root)
    paths = [tag / f"zero_pp_rank_{r}_mp_rank_00_model_states.pt" for r in range(10, 16)]
    for p in paths[:-1]:
        _, archive = load(str(p), skip=frozenset({"module"}))
        archive.close()
    last = paths[-1]
    raw = last.read_bytes()
    stem = b"zero_pp_rank_15_mp_rank_00_model_states/"
    odd = b"zero_pp_rank_15/mp_rank_00_model_states/"
    assert len(stem) == len(odd)
    last.write_bytes(raw.replace(stem, odd))
    with pytest.raises(Exception, match=r"data\.pkl|two folders"):
        load(str(last), skip=frozenset({"module"}))
