"""Check a universal checkpoint against the ZeRO checkpoint it came from: every fp32 master, both Adam
moments, frozen parameters, the optimizer step and the model-states copies, streamed in fixed chunks.

Works on ours and on DeepSpeed's `ds_to_universal` output (which is how its round-robin bug shows up).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import numpy as np

from inspector.convert.reader import buffer
from inspector.convert.verify import VerifyProgress, VerifyResult
from inspector.errors import CancelledError, InspectorError
from inspector.format.dtypes import itemsize
from inspector.scan.model import Checkpoint, Kind, Segment, TensorInfo
from inspector.system.bytesource import ByteSource

if TYPE_CHECKING:
    from inspector.convert.reader import FilePool

CHUNK_ELEMS = 1 << 20


def verify_universal(
    src: Checkpoint, uni: Checkpoint, cancel: threading.Event | None = None
) -> Iterator[VerifyProgress | VerifyResult]:
    """Yield progress, then the result. `uni` is `scan_universal` of the output folder; `cancel` stops it
    between chunks (CancelledError)."""
    from inspector.convert.kinds.universal.layouts import universal_view

    res = VerifyResult()
    jobs: list[tuple[str, tuple[Segment, ...], tuple[Segment, ...]]] = []
    have = {t.name: t for t in uni.tensors}
    expected = universal_view(src)  # the source as the folder holds it (native MoE: stacked expert slots)
    for t in expected:
        if t.kind not in (Kind.TRAINABLE, Kind.FROZEN):
            continue
        u = have.get(t.name)
        if u is None or u.kind is Kind.TIED:
            if t.kind is Kind.TRAINABLE:
                res.missing.append(t.name)
            continue
        if u.shape != t.shape:
            res.mismatched.append(f"{t.name} (shape {u.shape} != {t.shape})")
            continue
        jobs.append((f"{t.name}/fp32", t.segments, u.segments))
        if t.kind is Kind.TRAINABLE:
            got = dict(u.moments)
            for m, segs in t.moments:
                if m in got:
                    jobs.append((f"{t.name}/{m}", segs, got[m]))
                else:
                    res.missing.append(f"{t.name}/{m}")
    res.mismatched += _wrong_keys(src, expected, have, uni.source)
    src_names = {t.name for t in expected if t.kind in (Kind.TRAINABLE, Kind.FROZEN)}
    res.unexpected += [u.name for u in uni.tensors if u.kind is Kind.TRAINABLE and u.name not in src_names]
    if src.optimizer_step != uni.optimizer_step:
        res.mismatched.append(f"optimizer step ({uni.optimizer_step} != {src.optimizer_step})")
    total = sum(sum(s.numel for s in a) * 4 for _, a, _ in jobs)
    from inspector.convert.reader import FilePool

    done = 0
    with FilePool(src.source, uni.source) as pool:
        for label, a, b in jobs:
            same = True
            for x, y in zip(_chunks(pool, a), _chunks(pool, b), strict=True):
                if cancel is not None and cancel.is_set():
                    raise CancelledError("Verification cancelled.")
                same = same and np.array_equal(x.view(np.uint32), y.view(np.uint32))
                done += x.nbytes
            yield VerifyProgress(done, total, label)
            res.checked += 1
            res.bytes_checked += sum(s.numel for s in a) * 4
            if not same:
                res.mismatched.append(label)
    for f in src.files:
        if f.role == "model":
            copy = os.path.join(uni.tag_dir, os.path.basename(f.path))
            if uni.source.kind(copy) == "missing":
                res.missing.append(os.path.basename(f.path))
            elif not _same_file(src.source, f.path, uni.source, copy):
                res.mismatched.append(os.path.basename(f.path))
    yield res


def _wrong_keys(
    src: Checkpoint, expected: tuple[TensorInfo, ...], have: dict[str, TensorInfo], source: ByteSource
) -> list[str]:
    """Files of a tensor- or expert-parallel layout whose keys beside `param` are not the ones its record gives
    (`layouts.layout_metadata`): DeepSpeed's loader cuts a file by them, so a wrong one resumes wrong with
    every byte right. (A data-parallel checkpoint's files need none: not checked, as DeepSpeed's own ZeRO-3
    output carries none.)"""
    from inspector.convert.kinds.universal.layouts import layout_metadata
    from inspector.format.torchzip import load_tree

    meta = layout_metadata(src, expected)
    if not meta:
        return []
    out = []
    for t in expected:
        u = have.get(t.name)
        if t.kind not in (Kind.TRAINABLE, Kind.FROZEN) or u is None or u.kind is Kind.TIED:
            continue
        want = {k: _plain(v) for k, v in meta.get(t.name, (("cat_dim", 0),))}
        files = [("fp32", u.segments), *((m, segs) for m, segs in u.moments)]
        for state, segs in files:
            if not segs:
                continue
            tree = load_tree(segs[0].file, source)
            got = {k: _plain(v) for k, v in tree.items() if k != "param"} if isinstance(tree, dict) else None
            if got != want:
                out.append(f"{t.name}/{state} (its tensor-parallel keys are not those of the recorded split)")
    return out


def _plain(value: Any) -> Any:
    """A key's value for comparison: a SubparamShape (ours, or the inert record read back) as its fields."""
    from inspector.convert.kinds.universal.tp_meta import SubparamShape
    from inspector.format.records import Record

    if isinstance(value, SubparamShape):
        return ("SubparamShape", repr(value.state()))
    if isinstance(value, Record):
        fields = {k: value.__dict__[k] for k in ("patterns", "shape", "partition_dim") if k in value.__dict__}
        return (value._qualname.rpartition(".")[2], repr(fields))
    return (type(value).__name__, value)


def _chunks(pool: FilePool, segs: tuple[Segment, ...]) -> Iterator[np.ndarray]:
    """The tensor as fp32 arrays of at most CHUNK_ELEMS elements (16-bit sources widened exactly)."""
    total = sum(s.numel for s in segs)
    pos = 0
    it = iter(segs)
    seg, used = next(it, None), 0
    while pos < total:
        n = min(CHUNK_ELEMS, total - pos)
        out = np.empty(n, dtype=np.float32)
        filled = 0
        while filled < n and seg is not None:
            size = itemsize(seg.dtype)
            take = min(n - filled, seg.numel - used)
            raw = buffer(take * size)
            pool.read_into(seg.file, seg.offset + used * size, raw.data)
            if seg.dtype == "bfloat16":
                out[filled : filled + take] = (raw.view(np.uint16).astype(np.uint32) << 16).view(np.float32)
            elif seg.dtype == "float16":
                out[filled : filled + take] = raw.view(np.float16)
            else:
                out[filled : filled + take] = raw.view(np.float32)
            filled += take
            used += take
            if used == seg.numel:
                seg, used = next(it, None), 0
        pos += n
        yield out


def _same_file(sa: ByteSource, a: str, sb: ByteSource, b: str, chunk: int = 8 << 20) -> bool:
    """Byte-equal regular files, each opened through its own folder (a link or a FIFO in place of the copy is
    not equal: it is refused before it is opened)."""
    try:
        fa = sa.open_handle(a)
    except InspectorError:
        return False
    try:
        fb = sb.open_handle(b)
    except InspectorError:
        fa.close()
        return False
    try:
        if fa.size != fb.size:
            return False
        pos = 0
        while True:
            x, y = fa.pread(chunk, pos), fb.pread(chunk, pos)
            if x != y:
                return False
            if not x:
                return True
            pos += len(x)
    finally:
        fa.close()
        fb.close()
