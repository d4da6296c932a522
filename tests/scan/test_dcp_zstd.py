"""DCP items saved through torch's zstd extension (`stream.zstd/1`; tests/fixtures/dcp/zstd, made by
make_dcp.py with torch 2.13 and zstandard 0.25.0): scanned, converted and checked from their decompressed bytes;
a zip bomb, a damaged stream and a missing `zstandard` are refused in words."""

from __future__ import annotations

import os
import pickle
import shutil
import sys
from pathlib import Path

import pytest

from inspector.cli.main import main
from inspector.errors import CorruptFileError, UnsupportedCheckpointError
from inspector.format.zstditem import ZstdItem, item_path, measure_item, open_item, parse_item_path
from inspector.parse.dcp import ZSTD, Item
from inspector.scan.layouts.dcp.items import place
from inspector.scan.scanner import scan
from inspector.system.source import Source

zstandard = pytest.importorskip("zstandard")

CASE = Path(__file__).resolve().parents[1] / "fixtures" / "dcp" / "zstd"


def test_every_item_of_the_fixture_is_compressed() -> None:
    """What makes the bit-exact convert of `zstd` in test_dcp.py prove decompression (torch's own file)."""
    torch = pytest.importorskip("torch")  # noqa: F841 - the metadata's classes, to read it as torch does
    with open(CASE / "ckpt" / ".metadata", "rb") as f:
        meta = pickle.load(f)  # the fixture this repository made, not an input under test
    infos = list(meta.storage_data.values())
    assert infos and all(i.transform_descriptors == [ZSTD] for i in infos)


def test_segments_read_the_decompressed_items() -> None:
    ckpt = scan(str(CASE))
    assert ckpt.errors == ()
    files = {s.file for t in ckpt.tensors for s in t.segments}
    assert files and all(parse_item_path(f) for f in files)


def test_health_and_verify_read_compressed_items(tmp_path: Path) -> None:
    out = tmp_path / "out"
    assert main(["convert", str(CASE), str(out)]) == 0
    assert main(["verify", str(CASE), str(out)]) == 0
    assert main(["health", str(CASE)]) in (0, 1)  # findings about the toy run's statistics may warn


def _stream(tmp_path: Path, raw: bytes) -> tuple[Path, Source, int]:
    path = tmp_path / "__0_0.distcp"
    blob = b"junk" + zstandard.ZstdCompressor().compress(raw)
    path.write_bytes(blob)
    return path, Source.at(str(tmp_path)), len(blob) - 4


def test_a_zip_bomb_is_refused_by_the_chunks_size(tmp_path: Path) -> None:
    """16 MiB of zeros in a few hundred bytes, named as a 4-element fp32 chunk: refused while streaming."""
    path, src, n = _stream(tmp_path, bytes(16 << 20))
    assert n < 4096
    with pytest.raises(CorruptFileError, match="decompresses to more than"):
        place(str(tmp_path), src, Item(path.name, 4, n, (ZSTD,)), "float32", (4,))


def test_a_damaged_stream_is_a_clear_error(tmp_path: Path) -> None:
    path, src, n = _stream(tmp_path, os.urandom(1 << 16))
    blob = bytearray(path.read_bytes())
    blob[4:8] = bytes(4)  # the frame's magic number (torch writes no checksum: damaged data reads as data)
    path.write_bytes(bytes(blob))
    with pytest.raises(CorruptFileError, match="zstd"):
        measure_item(str(path), src, 4, n, 1 << 20)


def test_reads_at_any_offset_in_any_order(tmp_path: Path) -> None:
    """The handle restarts the stream for a read behind it: every range comes back right."""
    raw = os.urandom(3 << 20)
    path, src, n = _stream(tmp_path, raw)
    first = measure_item(str(path), src, 4, n, len(raw))
    assert first.size == len(raw)
    first.close()
    handle = open_item(item_path(str(path), 4, n, len(raw)), (src,))
    for off, k in [(2 << 20, 1000), (5, 70_000), (100_000, 2 << 20), (len(raw) - 10, 50), (0, 1)]:
        assert handle.pread(k, off) == raw[off : off + k]
    handle.close()


def test_an_item_path_is_confined_to_the_folder(tmp_path: Path) -> None:
    (tmp_path / "in").mkdir()
    with pytest.raises(CorruptFileError, match="leads outside"):
        open_item(item_path(str(tmp_path / "x"), 0, 10, 10), (Source.at(str(tmp_path / "in")),))


def test_without_zstandard_the_message_says_how_to_get_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "zstandard", None)  # import zstandard -> ImportError
    with pytest.raises(UnsupportedCheckpointError, match=r"zero-inspector\[zstd\]"):
        scan(str(CASE))
    shutil.copytree(CASE, tmp_path / "c")
    assert main(["scan", str(tmp_path / "c")]) != 0
    assert "zero-inspector[zstd]" in capsys.readouterr().err.replace("\n", "")


def test_a_pool_opens_each_file_once_and_frees_a_stream_read_to_its_end(tmp_path: Path) -> None:
    """Many compressed items in one file: one descriptor, not one per item; no decompressor kept for an
    item read to its end (a pool keeps every item's handle until it closes)."""
    from inspector.convert.reader import FilePool

    raw = os.urandom(1 << 16)
    path, src, n = _stream(tmp_path, raw)
    with FilePool(src) as pool:
        items = [pool.handle(item_path(str(path), 4, n, len(raw) - k)) for k in (0, 1)]
        assert all(isinstance(h, ZstdItem) and h.inner is pool.handle(str(path)) for h in items)
        view = memoryview(bytearray(len(raw)))
        assert items[0].read_into(0, view) == len(raw) and bytes(view) == raw
        assert items[0]._stream is None
