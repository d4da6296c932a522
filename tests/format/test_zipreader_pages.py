"""A rank file read in a handful of calls (issue 43): the archive keeps its head page and its tail and serves
reads inside them again, and a replayed pickle's storages are checked in one loop (`storages_for`). Neither
may change a byte or a verdict: every read answers what the file holds, and `storages_for` gives exactly
what `storage` gives, refusals in its words."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch

from inspector.errors import CorruptFileError
from inspector.format.zipreader import TorchZip


def saved(tmp_path: Path, n: int = 40) -> Path:
    """A torch.save file with many small records (a stage-3 model-states file's shape) and a large one."""
    state = {f"p{i}": torch.full((i % 5,), float(i)) for i in range(n)}
    state["big"] = torch.arange(5000, dtype=torch.float32)
    tmp_path.mkdir(exist_ok=True)
    path = tmp_path / "states.pt"
    torch.save(state, path)
    return path


def test_reads_served_from_the_kept_pages_are_the_files_bytes(tmp_path: Path) -> None:
    path = saved(tmp_path)
    raw = path.read_bytes()
    calls = []
    with TorchZip(str(path)) as z:
        real = z.handle.pread
        z.handle.pread = lambda n, off: calls.append((n, off)) or real(n, off)  # type: ignore[method-assign]
        rng = random.Random(7)
        for _ in range(500):
            off = rng.randrange(len(raw))
            n = rng.randrange(0, min(6000, len(raw) - off) + 1)
            assert z.pread(n, off) == raw[off : off + n]
        for off in (0, len(raw) - 22, len(raw) - 1):  # the head, the end record, the last byte
            assert z.pread(len(raw) - off, off) == raw[off:]
        with pytest.raises(CorruptFileError):
            z.pread(10, len(raw) - 5)  # past the end: refused, never answered short
    assert len(calls) < 500, "reads inside the kept pages must not go to the file"


def test_a_rank_file_is_read_in_a_few_calls(tmp_path: Path) -> None:
    path = saved(tmp_path)
    calls = []
    with TorchZip(str(path)) as z:
        inner = z.handle.pread
        z.handle.pread = lambda n, off: calls.append(off) or inner(n, off)  # type: ignore[method-assign]
        z.read_entry(f"{z.prefix}data.pkl")
        z.byteorder()
        keys = [n.rsplit("/", 1)[1] for n in z.entries if "/data/" in n]
        z.storages_for([(k, "float32", 0) for k in keys])
    assert len(calls) <= 4, calls  # data.pkl with its header, and the storage headers a page at a time


def test_storages_for_is_storage_record_by_record(tmp_path: Path) -> None:
    path = saved(tmp_path)
    with TorchZip(str(path)) as a, TorchZip(str(path)) as b:
        keys = [n.rsplit("/", 1)[1] for n in a.entries if "/data/" in n]
        sizes = {k: a.entries[f"{a.prefix}data/{k}"].size for k in keys}
        requests = [(k, "float32", sizes[k] // 4) for k in keys]
        assert a.storages_for(requests) == {k: b.storage(k, d, n, None) for k, d, n in requests}


@pytest.mark.parametrize("request_kind", ["missing", "too-large"])
def test_storages_for_refuses_in_storages_words(tmp_path: Path, request_kind: str) -> None:
    path = saved(tmp_path)
    with TorchZip(str(path)) as a, TorchZip(str(path)) as b:
        key, numel = ("nope", 1) if request_kind == "missing" else ("3", 10_000)
        with pytest.raises(CorruptFileError) as batched:
            a.storages_for([("0", "float32", 0), (key, "float32", numel)])
        with pytest.raises(CorruptFileError) as single:
            b.storage(key, "float32", numel, None)
        assert batched.value.message == single.value.message


@pytest.mark.parametrize("legacy", [False, True])
def test_the_sniffed_head_page_is_not_read_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, legacy: bool
) -> None:
    """`torchzip.load` tells zip from legacy by the page it reads at byte 0 and hands that page to the
    archive, which keeps it: byte 0 is read from the file once."""
    from inspector.format import torchzip
    from inspector.system.source import LocalHandle

    path = tmp_path / "states.pt"
    torch.save({"a": torch.arange(7.0), "b": [1, 2]}, path, _use_new_zipfile_serialization=not legacy)
    at_zero: list[int] = []
    real = LocalHandle.pread

    def counting(self: LocalHandle, n: int, offset: int) -> bytes:
        if offset == 0:
            at_zero.append(n)
        return real(self, n, offset)

    monkeypatch.setattr(LocalHandle, "pread", counting)
    tree, archive = torchzip.load(str(path))
    try:
        assert isinstance(archive, TorchZip) != legacy and sorted(tree) == ["a", "b"]
        if not legacy:
            assert archive.pread(4, 0) == b"PK\x03\x04"  # served from the kept page
    finally:
        archive.close()
    page = min(4096, path.stat().st_size)
    if legacy:  # sniffed by the same page; the legacy reader then reads its pickles on its own
        assert at_zero[0] == page, at_zero
    else:
        assert at_zero == [page], at_zero


def test_a_small_rank_file_is_read_once_and_a_big_one_a_page_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A file up to WHOLE_FILE (a stage-3 model-states file) is read whole by its first read and every later
    read is served from it: one call (one request from a bucket) where it took six; a bigger file's first
    read is one page. The tree is the same either way."""
    from inspector.format import torchzip
    from inspector.system.source import LocalHandle

    small, big = saved(tmp_path / "s"), saved(tmp_path / "b", n=4000)
    assert small.stat().st_size <= torchzip.WHOLE_FILE < big.stat().st_size
    calls: list[tuple[int, int]] = []
    real = LocalHandle.pread
    monkeypatch.setattr(LocalHandle, "pread", lambda h, n, off: calls.append((n, off)) or real(h, n, off))
    for path, first in ((small, small.stat().st_size), (big, 4096)):
        calls.clear()
        tree, archive = torchzip.load(path)
        archive.close()
        assert calls[0] == (first, 0)
        assert len(calls) == 1 if path == small else len(calls) > 1
        assert sorted(tree) == sorted(torch.load(path, weights_only=True))
