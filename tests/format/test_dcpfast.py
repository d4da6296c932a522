"""The `.metadata` fast path reads exactly what the general opcode machine reads, and refuses what it refuses.

Each case is parsed twice, fast path on and off, and everything the parse leaves is compared: the records,
the arrays, the memo and its accounting, or the error's class and words. The fast path must have taken
records where the pickle has them, or the comparison would prove nothing.
"""

from __future__ import annotations

import dataclasses
import pickle
import random
from pathlib import Path
from typing import Any

import pytest

from inspector.errors import InspectorError
from inspector.format.dcpmeta import MetadataParser
from inspector.format.dcpops import Rec, Stand
from tests.benchmarks.dcp_metadata import write

FIXTURES = sorted(Path(__file__).parents[1].joinpath("fixtures").glob("dcp*/**/.metadata"))


def _value(v: Any) -> Any:
    if isinstance(v, Rec):
        return ("Rec", v.kind, _value(v.state))
    if isinstance(v, Stand):
        return ("Stand", v.name)
    if isinstance(v, dict):
        return {k: _value(x) for k, x in v.items()}
    return v


def _read(data: bytes, fast: bool) -> tuple[Any, int]:
    """Everything one parse leaves (or its refusal), and how many records the fast path took."""
    p = MetadataParser(lambda n, o: data[o : o + n], len(data), "m", fast=fast)
    try:
        raw = p.parse()
    except InspectorError as exc:
        return ("refused", type(exc).__name__, str(exc)), p.fast.taken
    fields = {f.name: _value(getattr(raw, f.name)) for f in dataclasses.fields(raw)}
    memo = {k: _value(v) for k, v in p.memo.items()}
    return (fields, memo, p.next_memo, p.retained, p.loose), p.fast.taken


def _same(data: bytes) -> int:
    general, none = _read(data, fast=False)
    fast, taken = _read(data, fast=True)
    assert none == 0
    assert fast == general
    return taken


@pytest.mark.parametrize("path", FIXTURES, ids=lambda p: str(p.relative_to(p.parents[2])))
def test_fixtures_read_the_same_on_both_paths(path: Path) -> None:
    data = path.read_bytes()
    chunks = _read(data, fast=False)[0][0]["chunk_start"]
    taken = _same(data)
    assert taken >= len(chunks) - 8  # all but the first of each record shape and those a FRAME cut


def test_synthetic_metadata_reads_the_same(tmp_path: Path) -> None:
    path = tmp_path / ".metadata"
    write(str(path), 3000, 8)
    taken = _same(path.read_bytes())
    assert taken > 5000  # 3000 chunks and 3000 entries, less the first of each and those cut by a FRAME


def _torch_metadata() -> bytes:
    """torch's own classes pickled by Python's pickler: 0-D to 5-D chunks, offsets past 2^31 and 2^40,
    entries without an index or with transforms, bytes items, more than one FRAME."""
    torch = pytest.importorskip("torch")
    from torch.distributed.checkpoint.filesystem import _StorageInfo
    from torch.distributed.checkpoint.metadata import (
        BytesStorageMetadata,
        ChunkStorageMetadata,
        Metadata,
        MetadataIndex,
        TensorProperties,
        TensorStorageMetadata,
    )

    sdm: dict[str, Any] = {}
    storage: dict[Any, Any] = {}
    big = [0, 1, 255, 256, 65535, 65536, 2**31 - 1, 2**31, 2**40 + 7]
    for k in range(400):
        nd = k % 6
        chunks = []
        for c in range(3):
            off = tuple(big[(k + c + d) % len(big)] for d in range(nd))
            size = tuple(big[(k * 7 + c + d) % len(big)] for d in range(nd))
            chunks.append(ChunkStorageMetadata(torch.Size(off), torch.Size(size)))
            name = f"model.layers.{k}.w{'é' * (k % 3)}"
            hint = None if (k + c) % 11 == 0 else c
            tds = ["stream.zstd/1"] if k % 13 == 0 else None
            storage[MetadataIndex("".join(name), off, hint)] = _StorageInfo(
                f"__{c}_0.distcp", big[(k + c) % len(big)], big[(k * 3 + c) % len(big)], tds
            )
        props = TensorProperties(dtype=torch.float32)
        sdm[f"model.layers.{k}.w{'é' * (k % 3)}"] = TensorStorageMetadata(props, torch.Size([9] * nd), chunks)
    sdm["extra"] = BytesStorageMetadata()
    storage[MetadataIndex("extra")] = _StorageInfo("__0_0.distcp", 5, 6)
    data = pickle.dumps(Metadata(state_dict_metadata=sdm, storage_data=storage), protocol=4)
    assert data.count(b"\x95") > 1 and len(data) > 3 * 65536
    return data


def test_torch_pickled_metadata_reads_the_same() -> None:
    assert _same(_torch_metadata()) > 1000


@pytest.mark.parametrize("seed", range(4))
def test_damage_is_refused_the_same_way_on_both_paths(seed: int) -> None:
    """Bytes changed inside the repeated records (values out of range, another opcode, a memo slot written
    again): the fast path takes none that the general machine would refuse or read otherwise."""
    path = next(p for p in FIXTURES if "fsdp2_fp32" in str(p))
    data = path.read_bytes()
    start = data.index(b"ChunkStorageMetadata")
    rng = random.Random(seed)
    ops = [
        b"J\xff\xff\xff\xff",
        b"\x86",
        b"\x87",
        b"t",
        b"(",
        b"N",
        b"q\x2b",
        b"r\x2b\x00\x00\x00",
        b"\x94",
        b"0",
    ]
    for _ in range(60):
        at = rng.randrange(start, len(data) - 1)
        bad = data[:at] + rng.choice(ops) + data[at + rng.randrange(0, 3) :]
        _same(bad)


def test_a_memo_slot_written_again_retires_the_templates() -> None:
    """A crafted pickle rewrites the memo slot holding 'offsets' after the first chunk: the later chunks'
    references now name another string, and the fast path must not read them as 'offsets'."""
    path = next(p for p in FIXTURES if "fsdp2_fp32" in str(p))
    data = path.read_bytes()
    general = _read(data, fast=False)[0]
    first = data.index(b"\x8c\x05sizes")  # inside the first chunk's state dict, at a key's place
    p = MetadataParser(lambda n, o: data[o : o + n], len(data), "m")
    p.parse()
    idx = p.fast.refs[("s", "offsets")]
    crafted = data[:first] + b"\x8c\x01xr" + idx.to_bytes(4, "little") + b"\x8c\x01y" + data[first:]
    fast, _ = _read(crafted, fast=True)
    assert fast == _read(crafted, fast=False)[0] != general
    assert fast[0] == "refused" and "offsets" in fast[2]


@pytest.mark.parametrize(
    "value",
    [b"J\xff\xff\xff\xff", b"\x8a\x08" + (1 << 62).to_bytes(8, "little"), b"\x8a\x01\xff", b"\x88"],
    ids=["negative", "past-2^62", "negative-long", "bool"],
)
@pytest.mark.parametrize("field", ["offsets", "sizes"])
def test_a_chunk_value_out_of_range_is_refused_on_both_paths(field: str, value: bytes) -> None:
    """The tenth chunk (well past the first, so the template is compiled) gets a value the general
    machine refuses: the fast path must leave it to it."""
    path = next(p for p in FIXTURES if "fsdp2_fp32" in str(p))
    data = path.read_bytes()
    p = MetadataParser(lambda n, o: data[o : o + n], len(data), "m")
    p.parse()
    key = p.fast.refs[("s", field)].to_bytes(1, "little")
    size = p.fast.refs[("g", "Size")].to_bytes(1, "little")
    at = -1
    for _ in range(10):
        at = data.index(b"h" + key + b"h" + size + b"K", at + 1)
    crafted = data[: at + 4] + value + data[at + 6 :]
    fast, taken = _read(crafted, fast=True)
    assert taken >= 5  # the chunks before it went the fast way: the template was live when it came
    assert fast == _read(crafted, fast=False)[0]
    assert fast[0] == "refused" and field in fast[2]


@pytest.mark.parametrize(
    "value", [b"J\xff\xff\xff\xff", b"\x8a\x01\xff", b"N"], ids=["negative", "long", "none"]
)
@pytest.mark.parametrize("field", ["length", "index"])
def test_a_storage_value_out_of_range_is_refused_on_both_paths(field: str, value: bytes) -> None:
    """The tenth storage entry's length or chunk index out of range (or None where an int belongs): refused
    by the general machine, so never taken by the fast path."""
    path = next(p for p in FIXTURES if "fsdp2_fp32" in str(p))
    data = path.read_bytes()
    p = MetadataParser(lambda n, o: data[o : o + n], len(data), "m")
    p.parse()
    ref = b"j" + p.fast.refs[("s", field)].to_bytes(4, "little")
    at = -1
    for _ in range(10):
        at = data.index(ref, at + 1)
    end = at + 5 + {ord("K"): 2, ord("M"): 3, ord("J"): 5}[data[at + 5]]
    crafted = data[: at + 5] + value + data[end:]
    fast, taken = _read(crafted, fast=True)
    general = _read(crafted, fast=False)[0]
    assert taken >= 5 and fast == general
    assert fast[0] == "refused" or (field, value) == ("index", b"N")  # no index: matched by offsets later


def test_every_memo_slot_is_charged(monkeypatch: pytest.MonkeyPatch) -> None:
    """`None MEMOIZE` repeated, 2 bytes a slot: the memo is charged per slot, not only for strings, so a
    crafted file cannot grow it out of proportion (the cap lowered here to keep the test small)."""
    from inspector.format import dcpmeta

    monkeypatch.setattr(dcpmeta, "_MAX_RETAINED", 16 * 100)
    fine = b"\x80\x04" + b"N\x94" * 99 + b"."
    with pytest.raises(InspectorError, match="not a DCP Metadata"):
        _read_raise(fine)
    with pytest.raises(InspectorError, match="more memoized values"):
        _read_raise(b"\x80\x04" + b"N\x94" * 101 + b".")


def _read_raise(data: bytes) -> object:
    return MetadataParser(lambda n, o: data[o : o + n], len(data), "m").parse()
