"""`--merge-adapter`: a plain model folder with every LoRA delta folded in, W + scale·B·A, streamed.

The plan is an ordinary ConversionPlan over a synthetic tensor list: the base weights (from the checkpoint when
it holds them, else from the base model's safetensors), overlaid by what training changed (modules_to_save,
trained biases), under the plain model's names. Execution streams each tensor in row blocks of at most
`chunk_elems` elements: positioned reads, numpy fp32 arithmetic for the adapted layers (A and B, r by n, are
small and read once per layer), a cast (ml_dtypes for bf16, round to nearest even like torch), a positioned
write. Memory stays a few row blocks whatever the model. No torch.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import numpy as np

from inspector.convert.options import ConvertOptions
from inspector.convert.plan import META_KEY, ConversionPlan, PlannedTensor, build_plan
from inspector.convert.reader import FilePool, iter_chunks
from inspector.errors import CancelledError, InspectorError
from inspector.format.dtypes import DTYPES, itemsize, numpy_dtype
from inspector.remote.roots import source_at
from inspector.scan.basemodel import BaseModel, BaseModelError, base_source, read_base_model, resolve_base
from inspector.scan.model import Checkpoint, Kind, Segment, TensorInfo
from inspector.scan.peft import Adapter, is_lora, plain_name, require_mergeable

if TYPE_CHECKING:
    from inspector.convert.kinds.safetensors import ShardWriter

MERGED_KEY = "merged_adapter"
BASE_KEY = "merged_base"  # the base model folder it was merged into (verify recomputes from it)


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
        """Memory beyond the plan's chunk buffers: the largest A and B in fp32, and fp32 row blocks."""
        ab = max((4 * (m.a.numel + m.b.numel) for m in self.merges.values()), default=0)
        return ab + 3 * 4 * self.plan.options.chunk_elems


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
    synthetic = replace(ckpt, tensors=tuple(entries.values()), layout=ckpt.layout)
    opts = replace(opts, strip_prefix=(), exclude_frozen=False, dedupe_tied=False)
    plan = build_plan(synthetic, opts, allow_damaged=allow_damaged)
    plan = replace(plan, shards=tuple(replace(s, header=_mark_merged(s.header, folder)) for s in plan.shards))
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


def _fingerprint(plan: ConversionPlan, merges: dict[str, Merge], model: BaseModel | None) -> str:
    """The job a resumed merge may continue: the checkpoint and options, every scale, and the base files."""
    h = hashlib.sha256(f"merged|{plan.fingerprint}".encode())
    for name in sorted(merges):
        m = merges[name]
        h.update(f"|{name}|{m.scale!r}|{m.transposed}".encode())
    for t in model.tensors if model is not None else ():
        h.update(f"|{t.name}|{[(s.file, s.offset, s.nbytes) for s in t.segments]}".encode())
    return h.hexdigest()[:16]


def _mark_merged(header: bytes, base: str | None) -> bytes:
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


def _read(pool: FilePool, segments: Sequence[Segment], dtype: str) -> np.ndarray:
    n = sum(s.numel for s in segments)
    buf = np.empty(n * itemsize(dtype), dtype=np.uint8)
    view = buf.data
    pos = 0
    for s in segments:
        pool.read_into(s.file, s.offset, view[pos : pos + s.nbytes])
        pos += s.nbytes
    return buf.view(numpy_dtype(dtype))


def _as_f32(pool: FilePool, t: TensorInfo) -> np.ndarray:
    return (
        _read(pool, t.segments, t.segments[0].dtype if t.segments else t.dtype)
        .astype(np.float32)
        .reshape(t.shape)
    )


def _pwrite_all(fd: int, data: memoryview, offset: int) -> None:
    while data:
        n = os.pwrite(fd, data, offset)
        data = data[n:]
        offset += n


def _bytes(a: np.ndarray) -> memoryview:
    """Raw bytes of an array (bf16 / fp8 have no buffer-protocol format, so go through uint8)."""
    return np.ascontiguousarray(a).reshape(-1).view(np.uint8).data


def _blocks(
    pool: FilePool, t: PlannedTensor, merge: Merge | None, limit: int
) -> Iterator[bytes | memoryview]:
    """The output bytes of one tensor, block by block (whole rows for merged weights)."""
    if merge is None:
        for segs in iter_chunks(t.segments, limit):
            src = _read(pool, segs, t.src_dtype)
            yield _bytes(src if t.src_dtype == t.out_dtype else src.astype(numpy_dtype(t.out_dtype)))
        return
    a, b = _as_f32(pool, merge.a), _as_f32(pool, merge.b)
    cols = t.shape[1]
    rows = max(1, limit // max(cols, 1))
    scale = np.float32(merge.scale)
    row = 0
    for segs in iter_chunks(t.segments, rows * cols):
        w = _read(pool, segs, t.src_dtype).astype(np.float32).reshape(-1, cols)
        end = row + w.shape[0]
        delta = (a[:, row:end].T @ b.T) if merge.transposed else (b[row:end] @ a)
        out = w + delta * scale
        row = end
        yield _bytes(out.astype(numpy_dtype(t.out_dtype)))


def merged_shards(mp: MergedPlan) -> ShardWriter:
    """The engine's shard writer for a merged model: each tensor's bytes computed block by block (`_blocks`)
    and written at its planned offset. The engine owns the run around it (lock, journal, resume, renames)."""
    plan = mp.plan

    def write(index: int, fd: int, cancel: threading.Event, fsync: bool) -> Iterator[tuple[int, str]]:
        with FilePool(*plan.sources) as pool:
            yield from _fill(pool, index, fd, cancel, fsync)

    def _fill(
        pool: FilePool, index: int, fd: int, cancel: threading.Event, fsync: bool
    ) -> Iterator[tuple[int, str]]:
        shard = plan.shards[index]
        _pwrite_all(fd, memoryview(shard.header), 0)
        yield len(shard.header), ""
        for t in shard.tensors:
            pos = len(shard.header) + t.offset
            for block in _blocks(pool, t, mp.merges.get(t.name), plan.options.chunk_elems):
                if cancel.is_set():
                    raise CancelledError("Conversion cancelled; partial files were removed.")
                _pwrite_all(fd, memoryview(block), pos)
                pos += len(block)
                yield len(block), t.name
            if pos != len(shard.header) + t.offset + t.nbytes:
                raise InspectorError(f"Internal error: {t.name} wrote {pos} bytes, planned otherwise.")
        if fsync:
            os.fsync(fd)

    return write
