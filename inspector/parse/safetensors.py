"""safetensors headers and `model.safetensors.index.json` as typed records, checked the way safetensors'
own `Metadata::validate` checks them: a JSON object of entries with a known dtype, a non-negative shape and
`data_offsets` that run contiguously from 0, each exactly `numel * itemsize` long, the last ending where the
file ends; `__metadata__` a str -> str object; every tensor name through the one name rule. Read by `verify`
(the output it checks) and by the merge (a base model), both through a confined `Source`.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from inspector.errors import InputError
from inspector.format.dtypes import FROM_SAFETENSORS, itemsize
from inspector.parse.names import check_name
from inspector.parse.tree import Node
from inspector.system.bytesource import ByteSource
from inspector.system.source import os_error

MAX_HEADER = 100_000_000  # safetensors' own limit
MAX_INDEX = 64 << 20
META = "__metadata__"


@dataclass(frozen=True, slots=True)
class Entry:
    """One tensor of a safetensors file: name, our dtype name, shape, byte range within the data section."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    begin: int
    end: int

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


@dataclass(frozen=True)
class Header:
    """A checked safetensors header: entries in file order, metadata, where the data section starts."""

    file: str
    entries: tuple[Entry, ...]
    metadata: Mapping[str, str]
    data_start: int
    file_size: int

    def names(self) -> set[str]:
        return {e.name for e in self.entries}


def read_header(source: ByteSource, path: str, *, exact: bool = True) -> Header:
    """Read and check one safetensors file's header through `source` (a folder: no link out, no FIFO; or a
    bucket prefix), bounded. `exact=False` (verify) lets the file be shorter than its tensors: verify
    reports which are cut off."""
    handle = source.open_handle(path)
    try:
        size = handle.size
        head = handle.pread(8, 0)
        if len(head) != 8:
            raise InputError(path, "header length", "the file is shorter than 8 bytes")
        n = int.from_bytes(head, "little")
        if n > MAX_HEADER or 8 + n > size:
            raise InputError(path, "header length", f"{n:,} bytes does not fit a {size:,}-byte file")
        raw = handle.pread(n, 8)
    except OSError as exc:
        raise os_error(path, exc) from None
    finally:
        handle.close()
    return parse_header(raw, path, size, exact=exact)


def parse_header(raw: bytes, path: str, size: int, *, exact: bool = True) -> Header:
    """The header bytes (after the 8-byte length) of a `size`-byte file, checked."""
    try:
        doc = json.loads(raw.decode("utf-8"), parse_constant=_refuse)
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise InputError(path, "header", "is not valid JSON") from None
    node = Node(doc, path, "header")
    if not node.is_mapping():
        raise node.fail("is not a JSON object")
    metadata: dict[str, str] = {}
    entries = []
    for key, value in node.items_any():
        if key == META:
            metadata = _metadata(value)
            continue
        name = check_name(key, "tensor name", path, "header")
        entries.append(_entry(name, value))
    entries.sort(key=lambda e: (e.begin, e.end))
    pos = 0
    for e in entries:
        if e.begin != pos:
            raise InputError(path, f"header[{e.name!r}].data_offsets", "tensors overlap or leave a gap")
        pos = e.end
    start = 8 + len(raw)
    if exact and start + pos != size:
        raise InputError(path, "header", f"the tensors end at byte {start + pos:,}, the file at {size:,}")
    return Header(path, tuple(entries), MappingProxyType(metadata), start, size)


def _refuse(name: str) -> Any:
    raise ValueError(name)


def _metadata(node: Node) -> dict[str, str]:
    if not node.is_mapping():
        raise node.fail("is not a JSON object")
    return {k: v.text(1 << 24) for k, v in node.entries("metadata key", names=False)}


def _entry(name: str, node: Node) -> Entry:
    if not node.is_mapping():
        raise node.fail("is not a JSON object")
    code = node.at("dtype").text(16)
    dtype = FROM_SAFETENSORS.get(code)
    if dtype is None:
        raise node.at("dtype").fail("is not a dtype safetensors defines")
    shape = node.at("shape").shape()
    offsets = node.at("data_offsets").seq(2)
    if len(offsets) != 2:
        raise node.at("data_offsets").fail("does not hold [begin, end]")
    begin, end = (o.integer(0, 1 << 56) for o in offsets)
    if end < begin or end - begin != math.prod(shape) * itemsize(dtype):
        raise node.at("data_offsets").fail(f"span {end - begin:,} bytes, the shape and dtype need another size")
    return Entry(name, dtype, shape, begin, end)


@dataclass(frozen=True)
class Index:
    """`model.safetensors.index.json`: which file holds each tensor; file names are plain names in the folder."""

    file: str
    weight_map: Mapping[str, str]

    @property
    def files(self) -> list[str]:
        return sorted(set(self.weight_map.values()))


def read_index(source: ByteSource, path: str) -> Index:
    doc = source.read_json(path, MAX_INDEX, "safetensors index")
    node = Node(doc, path)
    wm = node.at("weight_map")
    if not wm.is_mapping():
        raise wm.fail("is missing or not a JSON object")
    weight_map = {name: v.name("shard file name") for name, v in wm.entries("tensor name")}
    return Index(path, MappingProxyType(weight_map))
