"""`--merge-adapter`: a plain model folder with every LoRA delta folded in, W + scale·B·A, streamed.

The plan is an ordinary ConversionPlan over a synthetic tensor list: the base weights (from the checkpoint when
it holds them, else from the base model's safetensors), overlaid by what training changed (modules_to_save,
trained biases), under the plain model's names. It runs through the safetensors pipeline like any
conversion (its producer and workers, the one buffer budget, shards side by side): a chunk of an adapted
weight is read, widened to fp32, given scale times the same elements of B·A (A and B, r by n, small, read
once per layer by the producer), cast (round to nearest even, as torch) and written at its offset, on the
workers, chunks of different tensors at once. Memory stays the pipeline's buffers plus two small fp32 blocks
per worker whatever the model. No torch.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, cast

import numpy as np

from inspector.convert.cast import cast_into, cast_raw, widen_bf16
from inspector.convert.options import ConvertOptions
from inspector.convert.plan import META_KEY, ConversionPlan, PlannedTensor, build_plan
from inspector.convert.reader import FilePool, read_bits
from inspector.errors import InspectorError
from inspector.format.dtypes import DTYPES, bits_dtype
from inspector.remote.roots import source_at
from inspector.scan.basemodel import BaseModel, BaseModelError, base_source, read_base_model, resolve_base
from inspector.scan.model import Checkpoint, Kind, TensorInfo
from inspector.scan.peft import Adapter, is_lora, plain_name, require_mergeable

if TYPE_CHECKING:
    from inspector.convert.kinds.safetensors import ShardWriter

MERGE_BLOCK = 1 << 14  # elements of fp32 a worker computes at once (three 64 KiB blocks: W, delta, product)
MERGED_KEY = "merged_adapter"
# the base it was merged into, by name and a hash of its tensor headers, never by path: the output travels
# (to a hub, to colleagues) and a path would carry the user's folder layout and user name with it
BASE_KEY = "merged_base"


@dataclass(frozen=True)
class Merge:
    """How one output weight is changed: W + scale · (B @ A), transposed for embeddings / fan_in_fan_out."""

    a: TensorInfo
    b: TensorInfo
    scale: float
    transposed: bool


@dataclass(frozen=True)
class MergedPlan:
    plan: ConversionPlan
    merges: dict[str, Merge]
    base_folder: str | None
    notes: tuple[str, ...]

    @property
    def work_bytes(self) -> int:
        """Memory beyond the plan's chunk buffers: A and B in fp32 (twice: the transposed copies) of every
        layer in flight (one per chunk in flight, at most), and each worker's two fp32 blocks. Bounded by the
        buffers, not the worker count: no more threads run than the pool has buffers (`pipeline.pool_plan`)."""
        from inspector.convert.pipeline import plan_threads, pool_plan

        depth, _ = pool_plan(self.plan, plan_threads(self.plan))
        ab = sorted((8 * (m.a.numel + m.b.numel) for m in self.merges.values()), reverse=True)
        cols = max((m.b.shape[0] if m.transposed else m.a.shape[1] for m in self.merges.values()), default=0)
        blocks = 3 * 4 * max(MERGE_BLOCK, cols)  # a worker's W, delta and product blocks (whole rows)
        return sum(ab[: depth + 1]) + min(depth, plan_threads(self.plan)) * blocks


def build_merged_plan(
    ckpt: Checkpoint,
    opts: ConvertOptions,
    adapter: Adapter,
    base: str | None = None,
    *,
    allow_damaged: bool = False,
) -> MergedPlan:
    """Plan the merged model. `base` (a folder) overrides adapter_config's base_model_name_or_path;
    `allow_damaged` (--force) writes it from a checkpoint the scan found errors in, as every kind but
    universal does."""
    require_mergeable(adapter)
    lora = {t.name for t in ckpt.tensors if is_lora(t.name)}
    names = {t.name for t in ckpt.tensors}
    needs_base = base is not None or any(
        f"{ly.module}.base_layer.weight" not in names for ly in adapter.layers
    )
    entries: dict[str, TensorInfo] = {}
    notes: list[str] = []
    folder = None
    if needs_base:
        folder = resolve_base(base, adapter.base_model, adapter.config_path)
        model: BaseModel = read_base_model(folder)
        entries = {t.name: t for t in model.tensors}
        notes.append(f"Base weights from {folder} ({len(model.tensors)} tensors).")
    for t in ckpt.tensors:
        if t.name in lora or ".original_module." in t.name or (t.kind is Kind.TIED and t.alias_of):
            continue
        name = plain_name(t.name)
        if name in entries and entries[name].shape != t.shape:
            raise BaseModelError(
                f"{name} is {list(t.shape)} in the checkpoint but {list(entries[name].shape)} in {folder}.",
                hint="The base model is not the one this adapter was trained on; pass the right one with --base.",
            )
        entries[name] = replace(t, name=name, kind=Kind.FROZEN if t.kind is Kind.TRAINABLE else t.kind)
    merges = _merges(ckpt, adapter, entries, folder)
    synthetic = replace(ckpt, tensors=tuple(entries.values()), layout=ckpt.layout)
    opts = replace(opts, strip_prefix=(), exclude_frozen=False, dedupe_tied=False)
    plan = build_plan(synthetic, opts, allow_damaged=allow_damaged)
    record = base_record(model) if needs_base else None
    plan = replace(plan, shards=tuple(replace(s, header=_mark_merged(s.header, record)) for s in plan.shards))
    if folder is not None:
        plan = replace(plan, sources=(*plan.sources, base_source(folder)))
    plan = replace(plan, fingerprint=_fingerprint(plan, merges, model if needs_base else None))
    kept = {t.name for s in plan.shards for t in s.tensors}
    merges = {n: m for n, m in merges.items() if n in kept}
    for pt in (pt for s in plan.shards for pt in s.tensors if pt.name in merges):
        if pt.out_dtype not in DTYPES or pt.src_dtype not in DTYPES:
            raise InspectorError(f"Cannot merge into {pt.name} ({pt.src_dtype} → {pt.out_dtype}).")
    notes.append(f"{len(merges)} LoRA layer(s) merged (scale {_scales(adapter)}).")
    return MergedPlan(plan, merges, folder, tuple(notes))


def _merges(
    ckpt: Checkpoint, adapter: Adapter, entries: dict[str, TensorInfo], folder: str | None
) -> dict[str, Merge]:
    """Each adapted weight's merge, checked against the weight it changes (present, 2-D, B·A's shape)."""
    merges: dict[str, Merge] = {}
    for ly in adapter.layers:
        w = entries.get(ly.base_weight)
        if w is None:
            raise BaseModelError(
                f"The adapted weight {ly.base_weight} is in neither the checkpoint nor the base model"
                + (f" at {folder}." if folder else "."),
                hint="Pass the base model this adapter was trained on with --base DIR.",
            )
        a, b = ckpt.tensor(ly.a), ckpt.tensor(ly.b)
        delta = (b.shape[0], a.shape[1])
        if len(w.shape) != 2 or (delta[::-1] if ly.transposed else delta) != w.shape:
            raise InspectorError(
                f"LoRA layer {ly.module}: B·A is {list(delta)} but the weight is {list(w.shape)}.",
                hint="Only Linear and Embedding LoRA layers can be merged.",
                title="Adapter problem",
            )
        merges[ly.base_weight] = Merge(a, b, ly.scale, ly.transposed)
    return merges


def _fingerprint(plan: ConversionPlan, merges: dict[str, Merge], model: BaseModel | None) -> str:
    """The job a resumed merge may continue: the checkpoint and options, every scale, and the base files."""
    h = hashlib.sha256(f"merged|{plan.fingerprint}".encode())
    for name in sorted(merges):
        m = merges[name]
        h.update(f"|{name}|{m.scale!r}|{m.transposed}".encode())
    for t in model.tensors if model is not None else ():
        h.update(f"|{t.name}|{[(s.file, s.offset, s.nbytes) for s in t.segments]}".encode())
    return h.hexdigest()[:16]


def base_record(model: BaseModel) -> dict[str, str]:
    """How a merged output names its base: the folder's own name (as a hub repository's is) and a SHA-256
    of every base tensor's name, dtype, shape and byte length, so verify can tell the right base from
    another without any local path in the output."""
    h = hashlib.sha256()
    for t in sorted(model.tensors, key=lambda t: t.name):
        h.update(f"{t.name}|{t.dtype}|{list(t.shape)}|{sum(s.nbytes for s in t.segments)}\n".encode())
    return {"name": os.path.basename(os.path.normpath(model.folder)), "tensors_sha256": h.hexdigest()}


def _mark_merged(header: bytes, base: dict[str, str] | None) -> bytes:
    """Record in the header metadata that the values are merged (so `verify` can say why it cannot compare)."""
    body = json.loads(header[8:])
    meta = json.loads(body["__metadata__"][META_KEY])
    body["__metadata__"][META_KEY] = json.dumps(
        {**meta, MERGED_KEY: True, BASE_KEY: base}, separators=(",", ":")
    )
    raw = json.dumps(body, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    return len(raw).to_bytes(8, "little") + raw


def is_merged_output(out_dir: str) -> bool:
    """Whether `out_dir` holds a --merge-adapter output (its values are not the checkpoint's, by design)."""
    from inspector.convert.verify import output_files
    from inspector.parse.safetensors import read_header

    try:
        out = source_at(out_dir, "output folder")
        header = read_header(out, os.path.join(out.root, output_files(out)[0]), exact=False)
        raw = header.metadata.get(META_KEY)
        doc = json.loads(raw) if raw else {}
        return isinstance(doc, dict) and doc.get(MERGED_KEY) is True
    except (InspectorError, ValueError, RecursionError):
        return False


def _scales(adapter: Adapter) -> str:
    values = sorted({round(ly.scale, 6) for ly in adapter.layers})
    how = "alpha/sqrt(r), rsLoRA" if adapter.rslora else "alpha/r"
    return ", ".join(f"{v:g}" for v in values[:4]) + f"; {how}"


def _as_f32(pool: FilePool, t: TensorInfo) -> np.ndarray:
    x = read_bits(pool, t.segments, t.segments[0].dtype if t.segments else t.dtype)
    if x.dtype != _BF16:
        return x.astype(np.float32).reshape(t.shape)
    w = np.empty(x.shape[0], np.float32)
    _widen(x, w)  # ml_dtypes' cast is this shift too, NaN payloads included
    return w.reshape(t.shape)


_BF16 = bits_dtype("bfloat16")  # bf16's bits ('V2'): widened and rounded here on the bits, no ml_dtypes


def _widen(x: np.ndarray, w: np.ndarray) -> None:
    """`x` into the fp32 array `w`, exactly: bf16 by its bits shifted up, anything else by cast.py."""
    if x.dtype == _BF16:
        widen_bf16(x.view(np.uint16), w.view(np.uint32))
    else:
        cast_into(x, w, threads=1)


def _narrow(w: np.ndarray, out: np.ndarray) -> None:
    """The fp32 array `w` cast into `out` as torch casts it: to bf16 on the bits (`cast_raw`), else cast.py."""
    if out.dtype == _BF16:
        cast_raw(w.view(np.uint8), "float32", out.view(np.uint8), "bfloat16", w.shape[0])
    else:
        cast_into(w, out, threads=1)


class _MergeMath:
    """The merged weights' output, computed on the pipeline's workers: a chunk's W (any rows, any columns)
    plus scale times the same elements of B·A, in fp32 blocks of MERGE_BLOCK elements (each worker's scratch,
    made once), cast into the chunk's output buffer. The producer reads each layer's A and B once."""

    def __init__(self, merges: dict[str, Merge]) -> None:
        self.merges = merges
        self.scratch = threading.local()

    def prepare(self, pool: FilePool, t: PlannedTensor) -> object | None:
        m = self.merges.get(t.name)
        if m is None:
            return None
        a, b = _as_f32(pool, m.a), _as_f32(pool, m.b)
        # the delta is left @ right: B·A, or (B·A)ᵀ = Aᵀ·Bᵀ for embeddings and fan_in_fan_out
        left, right = (np.ascontiguousarray(a.T), np.ascontiguousarray(b.T)) if m.transposed else (b, a)
        return left, right, np.float32(m.scale)

    def apply(self, ctx: object, t: PlannedTensor, start: int, src: np.ndarray, out: np.ndarray) -> None:
        left, right, scale = cast(tuple[np.ndarray, np.ndarray, np.float32], ctx)  # what `prepare` made
        cols = right.shape[1]
        group = max(1, MERGE_BLOCK // cols)  # rows of the delta per block: fixed by the shape alone
        w, d, p = self._blocks(group * cols)
        e, n = 0, src.shape[0]
        while e < n:
            r0 = (start + e) // cols // group * group  # the block of rows holding element start + e
            rows = min(group, left.shape[0] - r0)
            _delta(left[r0 : r0 + rows], right, d[: rows * cols], p[: rows * cols])
            lo = start + e - r0 * cols
            k = min(n - e, rows * cols - lo)
            delta = d[lo : lo + k]
            _widen(src[e : e + k], w[:k])  # exact: fp32, or a 16-bit source widened
            np.multiply(delta, scale, out=delta)
            np.add(w[:k], delta, out=w[:k])
            _narrow(w[:k], out[e : e + k])  # may be `src` itself: its elements e.. are read
            e += k

    def _blocks(self, size: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """This worker's three fp32 blocks, at least `size` elements (made once, grown for a wider row)."""
        w = getattr(self.scratch, "w", None)
        if w is None or w.shape[0] < size:
            self.scratch.w, self.scratch.d, self.scratch.p = (np.empty(size, np.float32) for _ in range(3))
        return self.scratch.w, self.scratch.d, self.scratch.p


def _delta(left: np.ndarray, right: np.ndarray, d: np.ndarray, p: np.ndarray) -> None:
    """`d` = left @ right for a block of whole rows, summed over the rank in a fixed order with elementwise
    ufuncs: every element's bits are the same whatever block it is computed in (BLAS picks its kernel and
    its order by the shape, and keeps a buffer for each calling thread: 64 workers held ~19 MiB more than 2),
    and the GIL is released for each ufunc on the block. Within verify's bound of r + 2 roundings."""
    rows, cols = left.shape[0], right.shape[1]
    out, part = d.reshape(rows, cols), p.reshape(rows, cols)
    np.multiply(left[:, :1], right[0], out=out)
    for j in range(1, right.shape[0]):
        np.multiply(left[:, j : j + 1], right[j], out=part)
        np.add(out, part, out=out)


def merged_shards(mp: MergedPlan) -> ShardWriter:
    """The executor's shard writer for a merged model: the safetensors pipeline (its producer, workers and
    one buffer budget, kernel copies for what needs no cast), with the adapted weights computed on the
    workers (`_MergeMath`). The executor owns the run around it (lock, journal, resume, renames)."""
    from inspector.convert.pipeline import shard_streamer

    return shard_streamer(mp.plan, _MergeMath(mp.merges))
