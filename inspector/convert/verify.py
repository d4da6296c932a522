"""Check converted safetensors against the checkpoint, byte for byte, streaming (flat memory again).

Each output tensor's source is re-read, converted exactly as `convert` does, and compared with the bytes in
the output file. Names come from the header metadata `convert` writes (renames, deduped aliases).
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from inspector.convert.plan import INDEX_NAME, META_KEY, SAFETENSORS_DTYPES, SINGLE_NAME
from inspector.convert.reader import TORCH_DTYPES, FilePool, byte_view, iter_chunks, read_segments
from inspector.errors import InspectorError
from inspector.format.dtypes import itemsize
from inspector.scan.model import Checkpoint

_FROM_ST = {v: k for k, v in SAFETENSORS_DTYPES.items()}


@dataclass
class VerifyResult:
    checked: int = 0
    bytes_checked: int = 0
    mismatched: list[str] = field(default_factory=list)
    unexpected: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not (self.mismatched or self.unexpected or self.missing)


@dataclass(frozen=True)
class VerifyProgress:
    bytes_done: int
    bytes_total: int
    tensor: str


def read_header(path: str) -> tuple[dict[str, Any], int]:
    """A safetensors header and the offset where its data starts."""
    try:
        with open(path, "rb") as fh:
            raw = fh.read(8)
            if len(raw) != 8:
                raise ValueError("file shorter than 8 bytes")
            n = int.from_bytes(raw, "little")
            if n > 100_000_000:
                raise ValueError(f"header length {n} is implausible")
            header = json.loads(fh.read(n))
    except (OSError, ValueError) as exc:
        raise InspectorError(
            f"{path} is not a readable safetensors file ({exc}).", title="Bad output file"
        ) from None
    return header, 8 + n


def output_files(out_dir: str) -> list[str]:
    index = os.path.join(out_dir, INDEX_NAME)
    if os.path.isfile(index):
        with open(index) as fh:
            weight_map = json.load(fh).get("weight_map", {})
        return sorted(set(weight_map.values()))
    if os.path.isfile(os.path.join(out_dir, SINGLE_NAME)):
        return [SINGLE_NAME]
    raise InspectorError(
        f"{out_dir} holds no {SINGLE_NAME} or {INDEX_NAME}.",
        hint="Point verify at the folder `convert` wrote.",
        title="Nothing to verify",
    )


def run_verify(
    ckpt: Checkpoint, out_dir: str, cancel: threading.Event | None = None, chunk_elems: int = 1 << 22
) -> Iterator[VerifyProgress | VerifyResult]:
    res = VerifyResult()
    files = output_files(out_dir)
    headers = [(f, *read_header(os.path.join(out_dir, f))) for f in files]
    meta: dict[str, Any] = {}
    for _, h, _ in headers:
        raw = (h.get("__metadata__") or {}).get(META_KEY)
        if raw:
            meta = json.loads(raw)
            break
    renamed: dict[str, str] = meta.get("renamed", {})
    aliases: dict[str, str] = meta.get("aliases", {})
    total = sum(
        int(v["data_offsets"][1]) - int(v["data_offsets"][0])
        for _, h, _ in headers
        for k, v in h.items()
        if k != "__metadata__"
    )
    seen: set[str] = set()
    done = 0
    with FilePool() as pool:
        for fname, header, base in headers:
            path = os.path.join(out_dir, fname)
            size = os.path.getsize(path)
            for name, info in header.items():
                if name == "__metadata__":
                    continue
                if cancel is not None and cancel.is_set():
                    return
                src_name = renamed.get(name, name)
                seen.add(src_name)
                try:
                    src = ckpt.tensor(src_name)
                except KeyError:
                    res.unexpected.append(name)
                    continue
                out_dtype = _FROM_ST.get(info["dtype"], "")
                begin, end = (int(x) for x in info["data_offsets"])
                if (
                    tuple(info["shape"]) != src.shape
                    or out_dtype not in TORCH_DTYPES
                    or (end - begin) != src.numel * itemsize(out_dtype)
                ):
                    res.mismatched.append(f"{name} (shape/dtype)")
                    continue
                if base + end > size:  # a cut-off output file is a verify failure, not a damaged checkpoint
                    res.mismatched.append(f"{name} ({fname} is truncated)")
                    continue
                if not _same(pool, src.segments, src.dtype, path, base + begin, out_dtype, chunk_elems):
                    res.mismatched.append(name)
                res.checked += 1
                res.bytes_checked += end - begin
                done += end - begin
                yield VerifyProgress(done, total, name)
    for alias, owner in aliases.items():
        seen.add(renamed.get(alias, alias))
        if owner not in {n for _, h, _ in headers for n in h}:
            res.missing.append(f"{owner} (owner of deduplicated alias {alias})")
    absent = [t.name for t in ckpt.tensors if t.name not in seen]
    if absent and meta.get("filtered"):
        res.notes.append(f"{len(absent)} checkpoint tensors were left out by the conversion's selection.")
    elif absent:
        res.missing += absent
    yield res


def _same(
    pool: FilePool, segments: Any, src_dtype: str, path: str, offset: int, out_dtype: str, chunk_elems: int
) -> bool:
    osz = itemsize(out_dtype)
    for segs in iter_chunks(segments, chunk_elems):
        src = read_segments(pool, segs, src_dtype)
        n = src.numel()
        expect = src.to(TORCH_DTYPES[out_dtype]) if src_dtype != out_dtype else src
        got = torch.empty(n * osz, dtype=torch.uint8)
        pool.read_into(path, offset, byte_view(got))
        if not torch.equal(got, expect.view(torch.uint8)):
            return False
        offset += n * osz
    return True
