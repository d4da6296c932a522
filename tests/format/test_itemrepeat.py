"""An item that repeats one read before is answered from it (format/itemrepeat.py), through one shared handle
whose reads inside the item's first and last page come from memory (format/readahead.py): the answer is the
full read's, and for every single-byte change of what the checks read (the head up to the tensor's bytes, the
directory and end records) the answer or the refusal, word for word, is the full read's too."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import pytest
import torch

from inspector.errors import InspectorError
from inspector.format import itemrepeat
from inspector.format.itemrepeat import Repeats
from inspector.format.readahead import PAGE, ReadAhead
from inspector.format.torchzip import load
from inspector.format.views import StorageRef, TensorRef
from inspector.format.zipreader import TorchZip
from inspector.system.source import Source

pytestmark = pytest.mark.usefixtures("fresh_caches")  # conftest: empty template and memo caches


def _item(t: torch.Tensor) -> bytes:
    buf = io.BytesIO()
    torch.save(t, buf)  # what DCP's FileSystemWriter stores for each chunk
    return buf.getvalue()


def _twice(tmp_path: Path, numel: int) -> tuple[Path, int]:
    """A file holding three items of one shape and other values, end to end (a DCP file's items)."""
    items = [_item(torch.arange(numel, dtype=torch.float32) * k) for k in (1, 3, 5)]
    assert len({len(i) for i in items}) == 1
    path = tmp_path / f"items{numel}.distcp"
    path.write_bytes(b"".join(items))
    return path, len(items[0])


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
    # the repeat: its head, and its tail with the next item's head after it (items lie end to end), no more
    head_next = range(2 * length, 2 * length + _parts(path, 2 * length, length)[0])
    allowed = {length + k for k in _compared(path, length, length)} | set(head_next)
    assert len(reads) == 2 and all(off + k in allowed for n, off in reads for k in range(n))
    assert any(off + n > 2 * length for n, off in reads)  # the next head was read with this tail


def _parts(path: Path, base: int, length: int) -> tuple[int, int]:
    """(head length, directory offset) of the item: where its tensor's bytes start, and end."""
    archive = TorchZip(str(path), Source.at(str(path.parent)), window=(base, length))
    try:
        end = archive.end_directory()
        assert end is not None
        return archive.record("0")[0] - base, end[2]
    finally:
        archive.close()


def _compared(path: Path, base: int, length: int) -> list[int]:
    """The item's bytes a repeat is compared on: its head up to the tensor's bytes, its directory on."""
    head, directory = _parts(path, base, length)
    return [*range(head), *range(directory, length)]


@pytest.mark.parametrize("numel", [6, 4000])
def test_every_byte_changed_gets_the_full_reads_answer_or_refusal(tmp_path: Path, numel: int) -> None:
    """The third item changed at one byte of what is compared (and a few of its tensor's), after the first
    is read in full and the second repeats it (its head then read with the second's tail): answered or
    refused exactly as a full read of it answers or refuses."""
    path, length = _twice(tmp_path, numel)
    third = 2 * length
    positions = _compared(path, third, length)
    positions += [positions[-1] // 2, positions[-1] // 2 + 1]  # tensor bytes: not compared, not checked
    source, outcomes = Source.at(str(tmp_path)), set()
    with path.open("r+b") as f:
        for pos in positions:
            for flip in (0x01, 0xFF) if pos % 7 == 0 else (0x01,):
                f.seek(third + pos)
                was = f.read(1)
                f.seek(third + pos)
                f.write(bytes([was[0] ^ flip]))
                f.flush()
                repeats, handle = Repeats(), source.open_handle(str(path))
                try:
                    ahead = ReadAhead(handle, str(path))
                    repeats.read(ahead, str(path), 0, length)  # the first item, learnt
                    assert (
                        repeats.read(ahead, str(path), length, length)[1] == length
                    )  # the second repeats it
                    fast = _outcome(
                        lambda r=repeats, a=ahead: _moved(*r.read(a, str(path), third, length), str(path))
                    )
                finally:
                    handle.close()
                slow = _outcome(lambda: _full(path, third, length))
                assert fast == slow, (pos, flip)
                outcomes.add(isinstance(slow, TensorRef))
                f.seek(third + pos)
                f.write(was)
    assert outcomes == {True, False}  # some changes are refused, some (unread CRCs, tensor bytes) are not


def test_bytes_read_past_an_item_are_a_head_only_where_the_next_item_starts(tmp_path: Path) -> None:
    """Past the second item lie a good head's bytes, then a third item whose pickle is damaged: its own
    head is read and it is refused, as a full read refuses it (the bytes past the second are not its head)."""
    a, b, c = (_item(torch.arange(6, dtype=torch.float32) * k) for k in (1, 3, 5))
    path = tmp_path / "gap.distcp"
    head = _parts_of(a)
    bad = bytearray(c)
    bad[70] ^= 0xFF  # inside data.pkl: its CRC-32 no longer matches
    path.write_bytes(a + b + a[:head] + bytes(bad))
    third, length = 2 * len(a) + head, len(a)
    repeats, handle = Repeats(), Source.at(str(tmp_path)).open_handle(str(path))
    try:
        ahead = ReadAhead(handle, str(path))
        repeats.read(ahead, str(path), 0, length)
        assert repeats.read(ahead, str(path), length, length)[1] == length  # a repeat: bytes past it read
        fast = _outcome(lambda: repeats.read(ahead, str(path), third, length))
    finally:
        handle.close()
    slow = _outcome(lambda: _full(path, third, length))
    assert fast == slow and "CRC-32" in slow[1]


def _parts_of(item: bytes) -> int:
    """Where an item's tensor bytes start (its head's length), from its tensor's local header."""
    at = item.index(b"archive/data/0") - 30
    nlen = int.from_bytes(item[at + 26 : at + 28], "little")
    xlen = int.from_bytes(item[at + 28 : at + 30], "little")
    return at + 30 + nlen + xlen
