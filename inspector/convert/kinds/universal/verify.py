"""Check a universal checkpoint against the ZeRO checkpoint it came from: every fp32 master, both Adam
moments, frozen parameters, the optimizer step and the model-states copies, streamed in fixed chunks.

Works on ours and on DeepSpeed's `ds_to_universal` output (which is how its round-robin bug shows up).

A stage-3 parameter's source is a slice of every rank's flat tensor: read slice by slice, the 126-layer
demo at 1,024 ranks took 2.8 M reads and 41 s to verify (its export, 14 s). Runs of parameters whose slices
are small are read as the export reads them (`convert/stripes.py`): one window of every rank's flat tensor,
each parameter gathered from the rows and compared with the folder's file.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from inspector.convert.cast import widen_bf16
from inspector.convert.reader import buffer
from inspector.convert.stripes import Stripe, fill_gaps, gather_one, grouped, small_slices, stripe_reads
from inspector.convert.verify import VerifyProgress, VerifyResult
from inspector.errors import CancelledError, InspectorError
from inspector.format.dtypes import bits_dtype, itemsize
from inspector.scan.model import Checkpoint, Kind, Segment, TensorInfo
from inspector.scan.slices import RankSlices
from inspector.system.bytesource import ByteSource

if TYPE_CHECKING:
    from inspector.convert.reader import FilePool

CHUNK_ELEMS = 1 << 20
STRIPE_BYTES = 8 << 20  # a stripe's rows (and its gathered parameter): two buffers of this, allocated once


@dataclass(frozen=True)
class _Check:
    """One file of the folder against its source: `a` the checkpoint's segments (a stage-3 parameter's
    `RankSlices`), `b` the folder's."""

    label: str
    a: Sequence[Segment]
    b: Sequence[Segment]

    @property
    def numel(self) -> int:
        return self.a.numel if isinstance(self.a, RankSlices) else sum(s.numel for s in self.a)


def _units(checks: list[_Check]) -> Iterator[_Check | Stripe[_Check]]:
    """The checks in order, runs of stage-3 parameters with small slices of one dtype as stripes."""

    def parts(c: _Check) -> tuple[RankSlices, ...] | None:
        s = small_slices(c.a)
        return (s,) if s is not None else None

    def key(c: _Check) -> str:
        return c.a.starts.dtype if isinstance(c.a, RankSlices) else ""

    def cap(c: _Check) -> int:
        return STRIPE_BYTES // c.a.starts.itemsize if isinstance(c.a, RankSlices) else 0

    return grouped(checks, parts, key, cap)


def verify_universal(
    src: Checkpoint, uni: Checkpoint, cancel: threading.Event | None = None
) -> Iterator[VerifyProgress | VerifyResult]:
    """Yield progress, then the result. `uni` is `scan_universal` of the output folder; `cancel` stops it
    between chunks (CancelledError)."""
    from inspector.convert.kinds.universal.layouts import universal_view

    res = VerifyResult()
    jobs: list[_Check] = []
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
        jobs.append(_Check(f"{t.name}/fp32", t.segments, u.segments))
        if t.kind is Kind.TRAINABLE:
            got = dict(u.moments)
            for m, segs in t.moments:
                if m in got:
                    jobs.append(_Check(f"{t.name}/{m}", segs, got[m]))
                else:
                    res.missing.append(f"{t.name}/{m}")
    res.mismatched += _wrong_keys(src, expected, have, uni.source)
    src_names = {t.name for t in expected if t.kind in (Kind.TRAINABLE, Kind.FROZEN)}
    res.unexpected += [u.name for u in uni.tensors if u.kind is Kind.TRAINABLE and u.name not in src_names]
    if src.optimizer_step != uni.optimizer_step:
        res.mismatched.append(f"optimizer step ({uni.optimizer_step} != {src.optimizer_step})")
    total = sum(c.numel * 4 for c in jobs)
    from inspector.convert.reader import FilePool

    done = 0
    with FilePool(src.source, uni.source) as pool:
        scratch = _Scratch()
        for unit in _units(jobs):
            if isinstance(unit, Stripe):
                checked = _stripe(pool, unit, scratch, cancel)
            else:
                mine, theirs = (
                    _chunks(pool, unit.a, scratch.raw, scratch.a),
                    _chunks(pool, unit.b, scratch.raw, scratch.b),
                )
                checked = iter([(unit, _same(mine, theirs, cancel))])
            for c, same in checked:
                done += c.numel * 4
                yield VerifyProgress(done, total, c.label)
                res.checked += 1
                res.bytes_checked += c.numel * 4
                if not same:
                    res.mismatched.append(c.label)
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


class _Scratch:
    """The run's buffers, allocated once: a chunk of each side as fp32, a piece's raw bytes, and a stripe's
    rows and gathered parameter."""

    def __init__(self) -> None:
        self.a, self.b = (np.empty(CHUNK_ELEMS, np.float32) for _ in range(2))
        self.raw = buffer(CHUNK_ELEMS * 8)
        self._rows: np.ndarray | None = None
        self._one: np.ndarray | None = None

    def stripe(self) -> tuple[np.ndarray, np.ndarray]:
        if self._rows is None or self._one is None:
            self._rows, self._one = buffer(STRIPE_BYTES), buffer(STRIPE_BYTES)
        return self._rows, self._one


def _same(mine: Iterator[np.ndarray], theirs: Iterator[np.ndarray], cancel: threading.Event | None) -> bool:
    """Whether two fp32 streams of one length (the shapes agree) hold the same bits, chunk for chunk."""
    same = True
    for x, y in zip(mine, theirs, strict=True):
        if cancel is not None and cancel.is_set():
            raise CancelledError("Verification cancelled.")
        same = same and np.array_equal(x.view(np.uint32), y.view(np.uint32))
    return same


def _stripe(
    pool: FilePool, st: Stripe[_Check], s: _Scratch, cancel: threading.Event | None
) -> Iterator[tuple[_Check, bool]]:
    """Each check of a stripe and whether it holds: every rank's window read once, each parameter gathered
    from the rows, widened to fp32 a chunk at a time and compared with the folder's file."""
    if cancel is not None and cancel.is_set():
        raise CancelledError("Verification cancelled.")
    raw, one = s.stripe()
    view = memoryview(raw)  # type: ignore[arg-type]  # numpy arrays are buffers
    pool.read_runs([(f, off, view[at : at + n]) for f, off, at, n in stripe_reads(st)])
    fill_gaps(st, raw)
    dtype = st.windows[0].starts.dtype
    bits = bits_dtype(dtype)
    rows = raw[: st.rows * bits.itemsize].view(bits)
    for c in st.tensors:
        sl = c.a
        assert isinstance(sl, RankSlices)  # a stripe's members are stage-3 slices
        values = one[: sl.numel * bits.itemsize].view(bits)
        gather_one(st, rows, sl, values)
        mine = (_widened(values[i : i + CHUNK_ELEMS], dtype, s.a) for i in range(0, sl.numel, CHUNK_ELEMS))
        yield c, _same(mine, _chunks(pool, c.b, s.raw, s.b), cancel)


def _chunks(
    pool: FilePool, segs: Sequence[Segment], raw: np.ndarray, out: np.ndarray
) -> Iterator[np.ndarray]:
    """The segments' values as fp32, CHUNK_ELEMS at a time (the last fewer) in `out`, each piece read into
    `raw` (16-bit sources widened exactly)."""
    total = sum(s.numel for s in segs)
    pos = 0
    it = iter(segs)
    seg, used = next(it, None), 0
    while pos < total:
        n = min(CHUNK_ELEMS, total - pos)
        filled = 0
        while filled < n and seg is not None:
            size = itemsize(seg.dtype)
            take = min(n - filled, seg.numel - used)
            piece = raw[: take * size]
            pool.read_into(seg.file, seg.offset + used * size, piece.data)
            _widened(piece, seg.dtype, out[filled : filled + take])
            filled += take
            used += take
            if used == seg.numel:
                seg, used = next(it, None), 0
        pos += n
        yield out[:n]


def _widened(raw: np.ndarray, dtype: str, out: np.ndarray) -> np.ndarray:
    """`raw` (a piece's bytes, or its values in their stored dtype, bf16 as its bits) as fp32 at the start
    of `out`, exactly."""
    if dtype == "bfloat16":
        bits = raw.view(np.uint16)
        got = out[: bits.shape[0]]
        widen_bf16(bits, got.view(np.uint32))
        return got
    values = raw.view(np.float16 if dtype == "float16" else np.float32)
    got = out[: values.shape[0]]
    got[...] = values
    return got


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
