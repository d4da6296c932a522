"""An item that repeats one read before is answered from it (format/itemrepeat.py), through one shared handle
whose reads inside the item's first and last page come from memory (format/readahead.py): the answer is the
full read's, and for every single-byte change of what the checks read (the head up to the tensor's bytes, the
directory and end records) the answer or the refusal, word for word, is the full read's too."""

from __future__ import annotations

import io
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from inspector.errors import InspectorError
from inspector.format import itemrepeat, memoguard, replay
from inspector.format.itemrepeat import Repeats
from inspector.format.readahead import PAGE, ReadAhead
from inspector.format.torchzip import load
from inspector.format.views import StorageRef, TensorRef
from inspector.format.zipreader import TorchZip
from inspector.system.source import Source


@pytest.fixture(autouse=True)
def _fresh_caches() -> Iterator[None]:
    replay._TEMPLATES.clear()
    memoguard._PASSED.clear()
    yield
    replay._TEMPLATES.clear()


def _item(t: torch.Tensor) -> bytes:
    buf = io.BytesIO()
    torch.save(t, buf)  # what DCP's FileSystemWriter stores for each chunk
    return buf.getvalue()


def _twice(tmp_path: Path, numel: int) -> tuple[Path, int]:
    """A file holding two items of one shape and other values, side by side (a DCP file's items)."""
    a = _item(torch.arange(numel, dtype=torch.float32))
    b = _item(torch.arange(numel, dtype=torch.float32) * 3)
    assert len(a) == len(b)
    path = tmp_path / f"items{numel}.distcp"
    path.write_bytes(a + b)
    return path, len(a)


def _full(path: Path, base: int, length: int) -> Any:
    tree, archive = load(str(path), Source.at(str(path.parent)), window=(base, length))
    archive.close()
    return tree


def _moved(tree: Any, shift: int, path: str) -> Any:
    """A tree `Repeats.read` gave, as the tree a full read of the item gives (a tensor moved by `shift`)."""
    if not isinstance(tree, TensorRef) or not shift:
        return tree
    s = tree.storage
    storage = StorageRef(path, s.key, s.dtype, s.offset + shift, s.nbytes)
    return TensorRef(storage, tree.storage_offset, tree.shape, tree.stride, tree.dtype)


def _outcome(call: Any) -> Any:
    try:
        return call()
    except InspectorError as exc:
        return (type(exc), str(exc))


@pytest.mark.parametrize("numel", [6, 4000])  # one page in all; far more than two (tensor bytes never read)
def test_a_repeat_is_answered_as_the_full_read_without_reading_it(
    tmp_path: Path, numel: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    path, length = _twice(tmp_path, numel)
    full_reads = []
    monkeypatch.setattr(itemrepeat, "load", lambda *a, **k: full_reads.append(a) or load(*a, **k))
    handle = Source.at(str(tmp_path)).open_handle(str(path))
    reads: list[tuple[int, int]] = []
    inner_pread = handle.pread
    handle.pread = lambda n, off: reads.append((n, off)) or inner_pread(n, off)  # type: ignore[method-assign]
    ahead, repeats = ReadAhead(handle, str(path)), Repeats()
    try:
        first = _moved(*repeats.read(ahead, str(path), 0, length), str(path))
        read_first = list(reads)
        reads.clear()
        second = _moved(*repeats.read(ahead, str(path), length, length), str(path))
    finally:
        handle.close()
    assert len(full_reads) == 1  # the second item was not read in full
    assert first == _full(path, 0, length) and second == _full(path, length, length)
    assert isinstance(second, TensorRef) and second.offset > length
    if length > 2 * PAGE:  # the full read: its first and last page read ahead, not all the tensor's bytes
        assert {(PAGE, 0), (PAGE, length - PAGE)} <= set(read_first) and sum(
            n for n, _ in read_first
        ) < length
    else:
        assert read_first[0] == (length, 0)  # one read for the whole item
    compared = _compared(path, length, length)
    assert len(reads) == 2 and sum(n for n, _ in reads) == len(compared)  # the repeat: head and tail, no more
    assert all(off - length + k in compared for n, off in reads for k in range(n))


def _compared(path: Path, base: int, length: int) -> list[int]:
    """The item's bytes a repeat is compared on: its head up to the tensor's bytes, its directory on."""
    archive = TorchZip(str(path), Source.at(str(path.parent)), window=(base, length))
    try:
        end = archive.end_directory()
        assert end is not None
        head = archive.record("0")[0] - base
        return [*range(head), *range(end[2], length)]
    finally:
        archive.close()


@pytest.mark.parametrize("numel", [6, 4000])
def test_every_byte_changed_gets_the_full_reads_answer_or_refusal(tmp_path: Path, numel: int) -> None:
    """The second item changed at one byte of what is compared (and a few of its tensor's): answered or
    refused exactly as a full read of it answers or refuses."""
    path, length = _twice(tmp_path, numel)
    positions = _compared(path, length, length)
    positions += [positions[-1] // 2, positions[-1] // 2 + 1]  # tensor bytes: not compared, not checked
    source, outcomes = Source.at(str(tmp_path)), set()
    with path.open("r+b") as f:
        for pos in positions:
            for flip in (0x01, 0xFF) if pos % 7 == 0 else (0x01,):
                f.seek(length + pos)
                was = f.read(1)
                f.seek(length + pos)
                f.write(bytes([was[0] ^ flip]))
                f.flush()
                repeats, handle = Repeats(), source.open_handle(str(path))
                try:
                    ahead = ReadAhead(handle, str(path))
                    repeats.read(ahead, str(path), 0, length)  # the intact item, learnt
                    fast = _outcome(
                        lambda r=repeats, a=ahead: _moved(*r.read(a, str(path), length, length), str(path))
                    )
                finally:
                    handle.close()
                slow = _outcome(lambda: _full(path, length, length))
                assert fast == slow, (pos, flip)
                outcomes.add(isinstance(slow, TensorRef))
                f.seek(length + pos)
                f.write(was)
    assert outcomes == {True, False}  # some changes are refused, some (unread CRCs, tensor bytes) are not
