"""Check converted safetensors against the checkpoint, byte for byte, streaming (flat memory again).

verify is meant to catch the converter's mistakes, so it shares as little with it as it can:
- the output is read through verify's own header parse and plain positioned reads of the output files, not
  through the plan (which fixed the header, the offsets and the shards the converter wrote);
- the expected bytes are rebuilt from the scanned Checkpoint's segments with verify's own walk (no chunking
  or buffer pools of the converter), and the two hot casts (fp32 → bf16, fp32 → fp16) are computed with
  integer arithmetic written here, not with numpy/ml_dtypes as the converter casts (tests/convert/test_cast.py
  holds both against torch), bf16 → fp32 and fp16 too (a shift first); the rarer casts (fp16 → bf16, fp16 →
  fp32) use the converter's cast.py;
- `against="module"` / `"masters"` checks the output against the other source than the one it was converted
  from: the 16-bit module copy and the fp32 masters are different bytes in different files.
What it does share, and why: the scan (where each tensor's bytes live). That arithmetic is proven separately
against DeepSpeed's own zero_to_fp32 by the interop suite and by the layout property tests; verify's job is
what the converter did with it (selection, names, offsets, casts, writes).
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from inspector.convert.cast import cast_into
from inspector.convert.plan import ADAPTER_FILE, INDEX_NAME, META_KEY, SINGLE_NAME, source_segments
from inspector.convert.reader import FilePool, buffer, empty
from inspector.errors import CancelledError, CorruptFileError, InputError, InspectorError
from inspector.format.dtypes import bits_dtype, itemsize, numpy_dtype
from inspector.parse.safetensors import Entry, Header, read_header, read_index
from inspector.parse.tree import Node
from inspector.remote.roots import source_at
from inspector.scan.model import Checkpoint, Segment
from inspector.system.bytesource import ByteSource


@dataclass
class VerifyResult:
    checked: int = 0
    bytes_checked: int = 0
    mismatched: list[str] = field(default_factory=list)
    unexpected: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    unreadable: list[str] = field(default_factory=list)  # source files that could not be read, and why
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not (self.mismatched or self.unexpected or self.missing or self.unreadable)


@dataclass(frozen=True)
class VerifyProgress:
    bytes_done: int
    bytes_total: int
    tensor: str


def output_files(out: ByteSource) -> list[str]:
    """The safetensors files of an output folder: the index's shards, or the single file."""
    if out.is_file(INDEX_NAME):
        return read_index(out, os.path.join(out.root, INDEX_NAME)).files
    for name in (SINGLE_NAME, ADAPTER_FILE):  # --adapter: one file, PEFT's tensor names
        if out.is_file(name):
            return [name]
    raise InspectorError(
        f"{out.root} holds no {SINGLE_NAME}, {INDEX_NAME} or {ADAPTER_FILE}.",
        hint="Point verify at the folder `convert` wrote.",
        title="Nothing to verify",
    )


def recorded_tag(out_dir: str) -> str | None:
    """The checkpoint tag the output was converted from (its header's `source_tag`), so `verify` without
    --tag compares with the tag that was converted, not with whatever `latest` names today."""
    try:
        out = source_at(out_dir, "output folder")
        files = output_files(out)
        return output_meta([read_header(out, os.path.join(out.root, files[0]), exact=False)]).tag
    except InspectorError:
        return None  # verify itself reports what is wrong with the output


def _adapter_absent(ckpt: Checkpoint, absent: list[str]) -> list[str]:
    """Of the checkpoint tensors not in an --adapter output, those the adapter should have held."""
    from inspector.scan.peft import detect_adapter

    adapter = detect_adapter(ckpt)
    wanted = set(adapter.tensors) if adapter is not None else set()
    return [n for n in absent if n in wanted]


def _unreadable_sources(ckpt: Checkpoint) -> list[str]:
    """Source files the scan could not read: verify names them instead of calling tensors unexpected."""
    return [
        f"{f.file}: {f.message}" if f.file and f.file not in f.message else f.message for f in ckpt.errors
    ]


def run_verify(
    ckpt: Checkpoint,
    out_dir: str,
    cancel: threading.Event | None = None,
    chunk_elems: int = 1 << 20,  # 4 MiB of fp32: the integer casts' temporaries stay small
    against: str | None = None,
) -> Iterator[VerifyProgress | VerifyResult]:
    """Yield progress, then one VerifyResult. `against`: "masters" or "module" (default: the source the
    output records it was converted from). Cancelling raises CancelledError, as the converter does."""
    res = VerifyResult()
    out = source_at(out_dir, "output folder")
    files = output_files(out)
    headers = [read_header(out, os.path.join(out.root, f), exact=False) for f in files]
    meta = output_meta(headers)
    renamed, aliases = meta.renamed, meta.aliases
    source = against or meta.source
    if source not in ("masters", "module"):
        raise InspectorError(f"Unknown verify source {source!r}.", hint="Use masters or module.")
    total = sum(e.end - e.begin for h in headers for e in h.entries)
    seen: set[str] = set()
    done = 0
    with FilePool(ckpt.source, out) as pool:
        for fname, header in zip(files, headers, strict=True):
            path, size, base = header.file, header.file_size, header.data_start
            for info in header.entries:
                name = info.name
                if cancel is not None and cancel.is_set():
                    raise CancelledError("Verification cancelled.")
                src_name = renamed.get(name, name)
                seen.add(src_name)
                nbytes = _check_tensor(
                    res,
                    pool,
                    ckpt,
                    src_name,
                    name,
                    info,
                    fname,
                    path,
                    size,
                    base,
                    source,
                    chunk_elems,
                    cancel,
                )
                if nbytes is None:
                    continue
                done += nbytes
                yield VerifyProgress(done, total, name)
    _finish(res, ckpt, files, headers, meta, source, renamed, aliases, seen)
    yield res


@dataclass(frozen=True)
class OutputMeta:
    """What the converter recorded in an output's header metadata (defaults when nothing is recorded)."""

    source: str = "masters"
    renamed: Mapping[str, str] = field(default_factory=dict)
    aliases: Mapping[str, str] = field(default_factory=dict)
    filtered: bool = False
    tag: str | None = None


def output_meta(headers: Sequence[Header]) -> OutputMeta:
    """The converter's metadata from the first output header that records it, typed like everything read."""
    for h in headers:
        raw = h.metadata.get(META_KEY)
        if not raw:
            continue
        try:
            doc = json.loads(raw)
        except (ValueError, RecursionError):
            raise InputError(h.file, f"__metadata__.{META_KEY}", "is not valid JSON") from None
        return _meta(Node(doc, h.file, f"__metadata__.{META_KEY}"))
    return OutputMeta()


def _pairs(node: Node) -> dict[str, str]:
    return {} if node.is_none() else {k: v.name("tensor name") for k, v in node.entries("tensor name")}


def _meta(node: Node) -> OutputMeta:
    if not node.is_mapping():
        raise node.fail("is not a JSON object")
    src, tag, filtered = node.at("source"), node.at("source_tag"), node.at("filtered").value
    return OutputMeta(
        src.text(16) if not src.is_none() else "masters",
        _pairs(node.at("renamed")),
        _pairs(node.at("aliases")),
        filtered is True,
        tag.name("tag") if not tag.is_none() else None,
    )


def _check_tensor(
    res: VerifyResult,
    pool: FilePool,
    ckpt: Checkpoint,
    src_name: str,
    name: str,
    info: Entry,
    fname: str,
    path: str,
    size: int,
    base: int,
    source: str,
    chunk_elems: int,
    cancel: threading.Event | None,
) -> int | None:
    """Compare one output tensor with its source, recording the outcome in `res`. Returns the bytes
    checked, or None when it could not be compared (unexpected, wrong shape, truncated, unreadable)."""
    try:
        src = ckpt.tensor(src_name)
    except KeyError:
        res.unexpected.append(name)
        return None
    out_dtype, begin, end = info.dtype, info.begin, info.end
    if info.shape != src.shape or (end - begin) != src.numel * itemsize(out_dtype):
        res.mismatched.append(f"{name} (shape/dtype)")
        return None
    if base + end > size:  # a cut-off output file is a verify failure, not a damaged checkpoint
        res.mismatched.append(f"{name} ({fname} is truncated)")
        return None
    segments = source_segments(src, out_dtype, source)
    try:
        same = _same(pool, segments, path, base + begin, out_dtype, chunk_elems, cancel)
    except CorruptFileError as exc:
        res.unreadable.append(exc.message)
        return None
    if not same:
        res.mismatched.append(name)
    res.checked += 1
    res.bytes_checked += end - begin
    return end - begin


def _finish(
    res: VerifyResult,
    ckpt: Checkpoint,
    files: list[str],
    headers: list[Header],
    meta: OutputMeta,
    source: str,
    renamed: Mapping[str, str],
    aliases: Mapping[str, str],
    seen: set[str],
) -> None:
    """After every tensor: deduplicated aliases, source tensors absent from the output, and notes."""
    for alias, owner in aliases.items():
        seen.add(renamed.get(alias, alias))
        if owner not in {n for h in headers for n in h.names()}:
            res.missing.append(f"{owner} (owner of deduplicated alias {alias})")
    if res.unexpected and ckpt.errors:  # not unexpected: they live in files the scan could not read
        res.notes.append(
            f"{len(res.unexpected)} output tensors could not be found in the damaged checkpoint."
        )
        res.unreadable += _unreadable_sources(ckpt)
        res.unexpected = []
    absent = [t.name for t in ckpt.tensors if t.name not in seen]
    if files == [ADAPTER_FILE]:  # the export plan keeps only the adapter's tensors (and records no filter)
        absent = _adapter_absent(ckpt, absent)
        res.notes.append("Checked the PEFT adapter's tensors (the checkpoint's other tensors are not in it).")
    if absent and meta.filtered:
        res.notes.append(f"{len(absent)} checkpoint tensors were left out by the conversion's selection.")
    elif absent:
        res.missing += absent
    if source != meta.source:
        res.notes.append(f"Checked against the {source} (converted from the {meta.source}).")


def _pieces(segments: Sequence[Segment], limit: int) -> Iterator[list[Segment]]:
    """verify's own walk over the source: runs of at most `limit` elements (not the converter's chunks)."""
    out: list[Segment] = []
    room = limit
    for seg in segments:
        size = itemsize(seg.dtype)
        start = 0
        while start < seg.numel:
            n = min(room, seg.numel - start)
            out.append(Segment(seg.file, seg.offset + start * size, n, seg.dtype))
            start += n
            room -= n
            if not room:
                yield out
                out, room = [], limit
    if out:
        yield out


def _same(
    pool: FilePool,
    segments: Sequence[Segment],
    path: str,
    offset: int,
    out_dtype: str,
    limit: int,
    cancel: threading.Event | None,
) -> bool:
    osz = itemsize(out_dtype)
    for piece in _pieces(segments, limit):
        if cancel is not None and cancel.is_set():
            raise CancelledError("Verification cancelled.")
        src_dtype = piece[0].dtype
        n = sum(s.numel for s in piece)
        src = empty(n, bits_dtype(src_dtype))  # bf16 as its bits: no ml_dtypes for a copy or a shift
        raw = src.view(np.uint8).data
        pos = 0
        for seg in piece:
            pool.read_into(seg.file, seg.offset, raw[pos : pos + seg.nbytes])
            pos += seg.nbytes
        got = buffer(n * osz)
        pool.read_into(path, offset, got.data)
        if not np.array_equal(got, expected_bytes(src, src_dtype, out_dtype)):
            return False
        offset += n * osz
    return True


def expected_bytes(src: np.ndarray[Any, Any], src_dtype: str, out_dtype: str) -> np.ndarray[Any, Any]:
    """The output bytes for `src`: integer arithmetic for fp32 → bf16/fp16 and bf16 → fp32/fp16 (bf16 → fp32
    is exact, the bits shifted up, NaNs keeping sign and payload as torch's), cast.py for the rest."""
    if src_dtype == out_dtype:
        return src.view(np.uint8)
    if src_dtype == "bfloat16" and out_dtype in ("float32", "float16"):  # torch's goes through fp32
        wide = src.view(np.uint16).astype(np.uint32) << 16
        return (wide if out_dtype == "float32" else fp16_bits(wide)).view(np.uint8)
    if src_dtype == "float32" and out_dtype == "bfloat16":
        return bf16_bits(src.view(np.uint32)).view(np.uint8)
    if src_dtype == "float32" and out_dtype == "float16":
        return fp16_bits(src.view(np.uint32)).view(np.uint8)
    out = np.empty(src.shape[0], numpy_dtype(out_dtype))
    cast_into(src.view(numpy_dtype(src_dtype)), out, threads=1)  # bf16's bits as ml_dtypes' type (imported)
    return out.view(np.uint8)


def bf16_bits(u: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    """fp32 bit patterns → bf16 by round to nearest even on the integers; NaN → 0xFFFF (torch on x86)."""
    u = u.astype(np.uint32, copy=False)
    r = u >> 16
    r &= 1
    r += np.uint32(0x7FFF)
    r += u  # no wrap-around: only NaN patterns come near 2**32, and they are replaced below
    r >>= 16
    out = r.astype(np.uint16)
    nan = np.isnan(u.view(np.float32))
    if nan.any():
        out[nan] = 0xFFFF
    return out


def fp16_bits(u: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    """fp32 bit patterns → fp16, round to nearest even, on the integers (IEEE 754 binary16)."""
    u = u.astype(np.uint32, copy=False)
    sign = ((u >> 16) & 0x8000).astype(np.uint32)
    a = u & np.uint32(0x7FFFFFFF)
    out = np.zeros(u.shape[0], np.uint32)
    # normal results: rebias the exponent (127 -> 15) and round away the low 13 mantissa bits
    normal = (a >= 0x38800000) & (a < 0x477FF000)
    an = a[normal]
    out[normal] = (an - np.uint32(0x38000000) + np.uint32(0x0FFF) + ((an >> 13) & 1)) >> 13
    # subnormal results: the value in units of 2^-24, rounded to nearest even
    sub = (a < 0x38800000) & (a >= 0x33000000)
    asub = a[sub]
    mant = (asub & 0x7FFFFF) | 0x800000
    shift = (np.uint32(126) - (asub >> 23)).astype(np.uint32)  # 14..24 over this range
    q = mant >> shift
    rem = mant & ((np.uint32(1) << shift) - 1)
    half = np.uint32(1) << (shift - 1)
    q += ((rem > half) | ((rem == half) & ((q & 1) == 1))).astype(np.uint32)
    out[sub] = q
    out[(a >= 0x477FF000) & (a <= 0x7F800000)] = 0x7C00  # overflow and Inf
    nan = a > 0x7F800000
    out[nan] = 0x7E00 | ((a[nan] >> 13) & 0x3FF)  # quiet, top payload bits kept (F16C, as torch on x86)
    return (out | sign).astype(np.uint16)
