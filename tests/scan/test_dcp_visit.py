"""A DCP folder's items are checked file by file, one file open at a time (scan/layouts/dcp/visit.py): the
scan is the one the key-by-key walk gives (each item placed on its own), on every real fixture and on damaged
copies, and an item damaged in one file among many is reported with its file and its key."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from inspector.parse.dcp import read_metadata
from inspector.scan.layouts.dcp.build import Store
from inspector.scan.model import Checkpoint
from inspector.scan.scanner import scan
from inspector.system.source import Source
from inspector.text import shown

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "dcp"
CASES = sorted(p.name for p in FIXTURES.iterdir() if (p / "expected.npz").is_file())


def _seen(ckpt: Checkpoint) -> Any:
    """What a scan found, as plain values."""
    tensors = [
        (t.name, t.kind, t.shape, t.dtype, tuple(t.segments), t.moments, t.alias_of) for t in ckpt.tensors
    ]
    findings = [(f.severity, f.code, f.message, f.file, f.hint) for f in ckpt.findings]
    return tensors, findings, [(f.path, f.size) for f in ckpt.files], ckpt.global_steps


def _both(path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Any, Any]:
    """The scan, and the scan with no visit (every item placed on its own as its key is walked)."""
    visited = _seen(scan(str(path)))
    with monkeypatch.context() as m:
        m.setattr(Store, "visit", lambda self, keys: None)
        alone = _seen(scan(str(path)))
    return visited, alone


@pytest.mark.parametrize("case", CASES)
def test_the_visit_scans_every_fixture_as_the_key_walk_does(
    case: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    visited, alone = _both(FIXTURES / case, monkeypatch)
    assert visited == alone and visited[0]


def _items(ckpt: Path) -> list[tuple[str, str, int, int]]:
    """(key, file, offset, length) of every stored tensor item, in metadata order."""
    meta = read_metadata(str(ckpt), Source.at(str(ckpt)))
    out = []
    for key in meta.tensors:
        for row in meta.rows(key):
            item = meta.item(row)
            if item is not None:
                out.append((key, item.file, item.offset, item.length))
    return out


def _damage(ckpt: Path, file: str, at: int, change: Callable[[bytes], bytes], n: int) -> None:
    f = ckpt / file
    raw = f.read_bytes()
    f.write_bytes(raw[:at] + change(raw[at : at + n]) + raw[at + n :])


def _flip(b: bytes) -> bytes:
    return bytes(x ^ 0xFF for x in b)


def test_an_item_damaged_in_one_file_among_many_is_reported_with_its_file_and_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "hsdp"
    shutil.copytree(FIXTURES / "hsdp", root)
    ckpt = root / "ckpt"
    items = [i for i in _items(ckpt) if i[0].startswith("model.") and i[3] > 1600]
    key, file, offset, _ = items[-1]  # a weight's chunk in a later file; the other files are whole
    assert file != "__0_0.distcp" and len({i[1] for i in _items(ckpt)}) == 4
    _damage(ckpt, file, offset + 80, _flip, 4)  # inside data.pkl: its CRC-32 no longer matches
    visited, alone = _both(root, monkeypatch)
    assert visited == alone
    bad = [f for f in visited[1] if f[1] == "bad-chunks"]
    assert len(bad) == 1 and shown(key) in bad[0][2] and file in bad[0][2] and "CRC-32" in bad[0][2]
    whole = {t.name for t in scan(str(FIXTURES / "hsdp")).tensors}
    assert {t[0] for t in visited[0]} == whole - {key.removeprefix("model.")}  # only that key is lost


@pytest.mark.parametrize(
    "where",
    [
        "pickle",  # data.pkl's bytes: CRC-32 mismatch
        "local",  # a local header's signature
        "directory",  # a directory record's signature
        "unread-crc",  # the tensor's CRC-32 in the directory: no check reads it, the item stands
        "end",  # the end record's entry count
        "payload",  # the tensor's bytes: not checked at scan
        "cut",  # the file cut inside its last item
    ],
)
def test_damaged_items_are_found_as_the_key_walk_finds_them(
    where: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "uneven3"
    shutil.copytree(FIXTURES / "uneven3", root)
    ckpt = root / "ckpt"
    items = [i for i in _items(ckpt) if i[1] == "__1_0.distcp"]
    key, file, offset, length = max(items, key=lambda i: i[2])  # the file's last item
    raw = (ckpt / file).read_bytes()[offset : offset + length]
    cd = raw.index(b"PK\x01\x02")
    at = {
        "pickle": 70,
        "local": raw.index(b"archive/data/0") - 30,  # the tensor's local header: its offset hangs on it
        "directory": cd,
        "unread-crc": raw.index(b"archive/data/0", cd) - 46 + 16,
        "end": raw.index(b"PK\x06\x06") + 32,  # the zip64 end record's entry count (torch writes zip64)
        "payload": raw.index(b"archive/data/0") + 80,
        "cut": length - 30,
    }[where]
    if where == "cut":
        (ckpt / file).write_bytes((ckpt / file).read_bytes()[: offset + at])
    else:
        _damage(ckpt, file, offset + at, _flip, 1)
    visited, alone = _both(root, monkeypatch)
    assert visited == alone
    bad = [f for f in visited[1] if f[1] == "bad-chunks"]
    if where in ("unread-crc", "payload"):
        assert not bad
    else:
        assert len(bad) == 1 and shown(key) in bad[0][2] and file in bad[0][2]


def test_each_file_is_opened_once_and_one_at_a_time(monkeypatch: pytest.MonkeyPatch) -> None:
    ckpt = FIXTURES / "hsdp" / "ckpt"
    opened: list[str] = []
    open_now = [0, 0]  # open now, most open at once
    real_open = Source.open_handle

    def counting(self: Source, path: str) -> Any:
        handle = real_open(self, path)
        if path.endswith(".distcp"):
            opened.append(Path(path).name)
            open_now[0] += 1
            open_now[1] = max(open_now[1], open_now[0])
            close = handle.close

            def closing() -> None:
                open_now[0] -= 1
                close()

            handle.close = closing
        return handle

    monkeypatch.setattr(Source, "open_handle", counting)
    ckpt_scan = scan(str(ckpt))
    assert not [f for f in ckpt_scan.findings if f.code == "bad-chunks"]
    items = _items(ckpt)
    assert sorted(set(opened)) == sorted({i[1] for i in items})
    steps = len([t for t in ckpt_scan.tensors if t.moments])  # the `step` value is read on its own
    assert len(opened) <= len({i[1] for i in items}) + steps < len(items)
    assert open_now == [0, 1]


def test_an_item_that_is_not_the_chunk_the_metadata_says_is_refused_as_the_key_walk_refuses_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Two chunks of other shapes in one file pointed at each other's item (other items of both shapes are
    read before and after: the swapped ones are repeats, checked against what the metadata says)."""
    from inspector.scan.layouts.dcp import build

    real = build.read_metadata

    def swapped(folder: str, source: Any, name: str = ".metadata") -> Any:
        meta = real(folder, source, name)
        rows = [r for r in range(len(meta.starts)) if meta.item(r) is not None]
        by_file = [r for r in rows if meta.file_names[int(meta.item_file[r])] == "__1_0.distcp"]
        a = by_file[len(by_file) // 2]
        b = next(r for r in by_file if meta.chunk(r)[1] != meta.chunk(a)[1] and r > a)
        for col in (meta.item_offset, meta.item_length):
            col[a], col[b] = int(col[b]), int(col[a])
        return meta

    monkeypatch.setattr(build, "read_metadata", swapped)
    visited, alone = _both(FIXTURES / "uneven3", monkeypatch)
    assert visited == alone
    bad = [f[2] for f in visited[1] if f[1] == "bad-chunks"]
    assert len(bad) == 2 and all("the metadata says a contiguous" in m and "__1_0.distcp" in m for m in bad)
