"""Verify a merged model by recomputing it, independently of the writer.

The writer computes W + scale·(B·A) in fp32 numpy and casts once. Verify recomputes every merged weight in
float64 from the same source bytes (the checkpoint's masters for A and B, the checkpoint or the recorded base
folder for W) and accepts an output value when it is within one unit in the last place of the output dtype
at the reference value, plus the fp32 arithmetic's own bound: (r + 2) · 2⁻²⁴ · (|W| + |scale|·(|B|·|A|)).
Weights that are not merged must be the source bytes cast exactly as `verify` checks any conversion. What it
shares with the writer is the plan's map from output name to source bytes (the scan; proven elsewhere).
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Iterator
from typing import Any

import numpy as np

from inspector.convert.cast import widen_bf16
from inspector.convert.kinds.merged.merge import BASE_KEY, Merge, base_record, build_merged_plan
from inspector.convert.options import ConvertOptions
from inspector.convert.reader import FilePool, buffer, read_bits
from inspector.convert.verify import VerifyProgress, VerifyResult, expected_bytes, output_files
from inspector.errors import CancelledError, InspectorError
from inspector.format.dtypes import itemsize, numpy_dtype
from inspector.parse.safetensors import read_header
from inspector.remote.roots import source_at
from inspector.scan.basemodel import BaseModelError, read_base_model, resolve_base
from inspector.scan.model import Checkpoint, Segment
from inspector.scan.peft import detect_adapter
from inspector.system.bytesource import ByteSource
from inspector.text import shown

_ROWS_ELEMS = 1 << 20  # elements per row block: float64 temporaries stay a few MiB


def _recorded_base(out: ByteSource, first: str) -> str | dict[str, Any] | None:
    """What the output records of its base: None (the checkpoint held the base weights), its name and hash
    (`merge.base_record`), or a folder path (outputs written before the base was recorded by name)."""
    from inspector.convert.plan import META_KEY

    header = read_header(out, os.path.join(out.root, first), exact=False)
    try:
        doc = json.loads(header.metadata.get(META_KEY) or "{}")
    except ValueError:
        return None
    base = doc.get(BASE_KEY) if isinstance(doc, dict) else None
    return base if isinstance(base, (str, dict)) else None


def _base_folder(recorded: str | dict[str, Any] | None, base: str | None, adapter: Any) -> str | None:
    """The base folder to recompute from: `--base`, else where convert finds it by default (adapter_config's
    base_model_name_or_path); refused when its tensors are not those of the base the output was merged into."""
    if recorded is None:
        return None
    if isinstance(recorded, str):
        return base or recorded
    folder = resolve_base(base, adapter.base_model, adapter.config_path)
    if base_record(read_base_model(folder))["tensors_sha256"] != recorded.get("tensors_sha256"):
        raise BaseModelError(
            f"The base model at {folder} is not the one this model was merged into "
            f"({shown(str(recorded.get('name')))}): its tensors differ.",
            hint="Pass the base the merge used with --base DIR.",
        )
    return folder


def _values(raw: np.ndarray[Any, Any], dtype: str) -> np.ndarray[Any, Any]:
    """Bytes of `dtype` as numbers numpy computes on: bf16 widened to fp32 on its bits (exact; no ml_dtypes,
    ~0.9 CPU-s to import), numpy's own floats as they are, fp8 through ml_dtypes' types (imported then)."""
    raw = raw.view(np.uint8)
    if dtype == "bfloat16":
        wide = np.empty(raw.shape[0] // 2, np.uint32)
        widen_bf16(raw.view(np.uint16), wide)
        return wide.view(np.float32)
    return raw.view(numpy_dtype(dtype))


def _rows(segments: tuple[Segment, ...], start: int, count: int) -> list[Segment]:
    """The segments' elements [start, start + count) as segments (for reading a block of rows)."""
    out, pos = [], 0
    for s in segments:
        lo, hi = max(start, pos), min(start + count, pos + s.numel)
        if lo < hi:
            k = itemsize(s.dtype)
            out.append(Segment(s.file, s.offset + (lo - pos) * k, hi - lo, s.dtype))
        pos += s.numel
    return out


def _ulp(x: np.ndarray[Any, Any], dtype: str) -> np.ndarray[Any, Any]:
    """One unit in the last place of `dtype` at each |x| (its smallest subnormal below the normal range)."""
    nmant, normal, tiny = _finfo(dtype)
    e = np.floor(np.log2(np.maximum(np.abs(x), normal)))
    return np.maximum(2.0 ** (e - nmant), tiny)


def _finfo(dtype: str) -> tuple[int, float, float]:
    """(mantissa bits, smallest normal, smallest subnormal) of a float dtype: bf16's written here (its
    exponent is fp32's, 7 mantissa bits), numpy's own from np.finfo, fp8's from ml_dtypes (imported then)."""
    if dtype == "bfloat16":
        return 7, 2.0**-126, 2.0**-133
    if dtype in ("float16", "float32", "float64"):
        info = np.finfo(numpy_dtype(dtype))
    else:
        import ml_dtypes

        info = ml_dtypes.finfo(numpy_dtype(dtype))
    return int(info.nmant), float(info.smallest_normal), float(info.smallest_subnormal)


def _merged_ok(
    pool: FilePool,
    w_segs: tuple[Segment, ...],
    src_dtype: str,
    m: Merge,
    shape: tuple[int, ...],
    out_path: str,
    out_off: int,
    out_dtype: str,
    cancel: threading.Event | None,
) -> bool:
    a = _values(read_bits(pool, m.a.segments, m.a.segments[0].dtype), m.a.segments[0].dtype)
    b = _values(read_bits(pool, m.b.segments, m.b.segments[0].dtype), m.b.segments[0].dtype)
    a, b = a.astype(np.float64).reshape(m.a.shape), b.astype(np.float64).reshape(m.b.shape)
    rows_total, cols = shape
    step = max(1, _ROWS_ELEMS // max(cols, 1))
    r = m.a.shape[0]  # LoRA rank: A is (r, in)
    slack = (r + 2) * 2.0**-24
    osz = itemsize(out_dtype)
    for row in range(0, rows_total, step):
        if cancel is not None and cancel.is_set():
            raise CancelledError("Verification cancelled.")
        end = min(rows_total, row + step)
        n = (end - row) * cols
        w = _values(read_bits(pool, _rows(w_segs, row * cols, n), src_dtype), src_dtype)
        w = w.astype(np.float64).reshape(-1, cols)
        if m.transposed:
            delta, mag = a[:, row:end].T @ b.T, np.abs(a[:, row:end].T) @ np.abs(b.T)
        else:
            delta, mag = b[row:end] @ a, np.abs(b[row:end]) @ np.abs(a)
        ref = w + m.scale * delta
        raw = buffer(n * osz)
        pool.read_into(out_path, out_off + row * cols * osz, raw.data)
        got = _values(raw, out_dtype).astype(np.float64).reshape(-1, cols)
        tol = _ulp(ref, out_dtype) + slack * (np.abs(w) + abs(m.scale) * mag)
        if not (np.abs(got - ref) <= tol).all():
            return False
    return True


def _plain_ok(
    pool: FilePool, segs: tuple[Segment, ...], src_dtype: str, out_path: str, out_off: int, out_dtype: str
) -> bool:
    osz, pos = itemsize(out_dtype), 0
    numel = sum(s.numel for s in segs)
    while pos < numel:
        n = min(_ROWS_ELEMS, numel - pos)
        src = read_bits(pool, _rows(segs, pos, n), src_dtype)
        raw = buffer(n * osz)
        pool.read_into(out_path, out_off + pos * osz, raw.data)
        if not np.array_equal(raw, expected_bytes(src, src_dtype, out_dtype)):
            return False
        pos += n
    return True


def verify_merged(
    ckpt: Checkpoint, out_dir: str, *, base: str | None = None, cancel: threading.Event | None = None
) -> Iterator[VerifyProgress | VerifyResult]:
    """Yield progress, then one VerifyResult for a `--format merged` output (`base`: verify's --base)."""
    out = source_at(out_dir, "output folder")
    files = output_files(out)
    adapter = detect_adapter(ckpt)
    if adapter is None:
        raise InspectorError(
            "The checkpoint holds no LoRA adapter, so this merged model was not made from it.",
            hint="Pass the checkpoint (and --tag) the merged model was converted from.",
            title="Nothing to verify",
        )
    folder = _base_folder(_recorded_base(out, files[0]), base, adapter)
    mp = build_merged_plan(ckpt, ConvertOptions(), adapter, folder)
    planned = {t.name: t for s in mp.plan.shards for t in s.tensors}
    res = VerifyResult()
    headers = [read_header(out, os.path.join(out.root, f), exact=False) for f in files]
    total = sum(e.end - e.begin for h in headers for e in h.entries)
    done = 0
    seen: set[str] = set()
    with FilePool(*mp.plan.sources, out) as pool:
        for header in headers:
            for e in header.entries:
                seen.add(e.name)
                pt = planned.get(e.name)
                if pt is None:
                    res.unexpected.append(e.name)
                    continue
                off = header.data_start + e.begin
                m = mp.merges.get(e.name)
                if tuple(e.shape) != tuple(pt.shape):
                    ok = False
                elif m is not None:
                    ok = _merged_ok(
                        pool, pt.segments, pt.src_dtype, m, pt.shape, header.file, off, e.dtype, cancel
                    )
                else:
                    ok = _plain_ok(pool, pt.segments, pt.src_dtype, header.file, off, e.dtype)
                if not ok:
                    res.mismatched.append(e.name)
                res.checked += 1
                res.bytes_checked += e.end - e.begin
                done += e.end - e.begin
                yield VerifyProgress(done, total, e.name)
    absent = sorted(set(planned) - seen)
    if absent:
        res.notes.append(
            f"{len(absent)} weight(s) of the merged model are not in the output (excluded at convert?)."
        )
    res.notes.append(
        f"{len(mp.merges)} merged weight(s) recomputed in float64 and held to one ulp of the output dtype plus "
        "the fp32 arithmetic bound; the other weights compared byte for byte."
    )
    yield res
