"""safetensors headers and indexes as verify and the merge read them: checked like safetensors' own
`Metadata::validate`, one InputError for anything else (a truncated index, an entry that is not an object, a
missing dtype, `__metadata__` as a list, overlapping or out-of-file offsets), never another exception."""

from __future__ import annotations

import contextlib
import json
import struct
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from safetensors.numpy import save_file

from inspector.errors import CorruptFileError, InputError
from inspector.parse.safetensors import parse_header, read_header, read_index
from inspector.system.source import Source


def header_bytes(doc: object) -> bytes:
    return json.dumps(doc).encode()


GOOD = {"__metadata__": {"format": "pt"}, "a": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]},
        "b": {"dtype": "BF16", "shape": [3], "data_offsets": [16, 22]}}


def test_a_real_file_parses(tmp_path: Path) -> None:
    save_file({"w": np.arange(6, dtype=np.float32).reshape(2, 3), "b": np.zeros(2, np.int64)},
              str(tmp_path / "m.safetensors"), metadata={"format": "pt"})
    h = read_header(Source.at(tmp_path), str(tmp_path / "m.safetensors"))
    assert {e.name: (e.dtype, e.shape) for e in h.entries} == {"w": ("float32", (2, 3)), "b": ("int64", (2,))}
    assert h.metadata == {"format": "pt"}


@pytest.mark.parametrize(
    "doc",
    [
        [1, 2],  # not an object
        {**GOOD, "a": [1, 2]},  # an entry that is not an object
        {**GOOD, "a": {"shape": [2, 2], "data_offsets": [0, 16]}},  # missing dtype
        {**GOOD, "__metadata__": ["format", "pt"]},  # metadata as a list
        {**GOOD, "a": {"dtype": "F32", "shape": [-2, 2], "data_offsets": [0, 16]}},  # negative dim
        {**GOOD, "a": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 12]}},  # wrong size
        {**GOOD, "b": {"dtype": "BF16", "shape": [3], "data_offsets": [10, 16]}},  # overlap
        {**GOOD, "a": {"dtype": "Q4", "shape": [2, 2], "data_offsets": [0, 16]}},  # unknown dtype
        {**GOOD, "x\x1b]0;t\x07": {"dtype": "F32", "shape": [0], "data_offsets": [22, 22]}},  # escapes
    ],
)
def test_malformed_headers_are_one_error(doc: object) -> None:
    raw = header_bytes(doc)
    with pytest.raises(InputError) as err:
        parse_header(raw, "out.safetensors", 8 + len(raw) + 22)
    assert "\x1b" not in str(err.value)


def test_tensors_running_past_the_file_are_refused() -> None:
    raw = header_bytes(GOOD)
    with pytest.raises(InputError, match="end at byte"):
        parse_header(raw, "out.safetensors", 8 + len(raw) + 10)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=300), st.integers(0, 1 << 20))
def test_any_bytes_parse_or_raise_the_one_error(raw: bytes, size: int) -> None:
    with contextlib.suppress(InputError):
        parse_header(raw, "x.safetensors", size)


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_mutated_real_headers_parse_or_raise_the_one_error(data: st.DataObject) -> None:
    raw = bytearray(header_bytes(GOOD))
    for _ in range(data.draw(st.integers(1, 3))):
        raw[data.draw(st.integers(0, len(raw) - 1))] = data.draw(st.integers(32, 126))
    with contextlib.suppress(InputError):
        parse_header(bytes(raw), "x.safetensors", 8 + len(raw) + 22)


@pytest.mark.parametrize(
    "text",
    ['{"weight_map": {"a": "model-00001-of-00002.safetensors"', '{"weight_map": ["a"]}', '[]',
     '{"weight_map": {"a": "../../etc/passwd"}}', '{"weight_map": {"a": 3}}'],
)
def test_bad_indexes_are_one_error(tmp_path: Path, text: str) -> None:
    (tmp_path / "model.safetensors.index.json").write_text(text)
    with pytest.raises(CorruptFileError):  # InputError, or the Source's JSON refusal (its parent class)
        read_index(Source.at(tmp_path), str(tmp_path / "model.safetensors.index.json"))


def test_header_length_past_the_file(tmp_path: Path) -> None:
    (tmp_path / "x.safetensors").write_bytes(struct.pack("<Q", 1 << 40) + b"{}")
    with pytest.raises(InputError, match="header length"):
        read_header(Source.at(tmp_path), str(tmp_path / "x.safetensors"))
