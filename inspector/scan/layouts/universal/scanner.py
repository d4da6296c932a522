"""Read a DeepSpeed universal checkpoint (ours or `ds_to_universal`'s) into the same `Checkpoint` model.

A universal folder (FORMAT.md §4) holds `zero/<param>/{fp32,exp_avg,exp_avg_sq}.pt` (a dict with `param`, or
a bare flattened tensor for DeepSpeed's stage-3 output), `zero/optimizer_state.pt`, and copies of the
model-states files. The model states give names, order, shapes, buffers and tied aliases; each `.pt` gives
where its tensor's bytes are. Metadata only, as for ZeRO checkpoints: nothing here reads tensor data.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Mapping
from typing import Any

from inspector.errors import InspectorError, NotACheckpointError
from inspector.format.torchzip import TensorRef, load_tree
from inspector.parse.names import name_problem
from inspector.parse.states import ModelStates
from inspector.parse.universal import UniversalOptimizer, param_tensor, step_value
from inspector.scan.assemble import Folder, record
from inspector.scan.locate import read_tag_file, shown_tag
from inspector.scan.metadata import item
from inspector.scan.model import Checkpoint, FileInfo, Finding, Kind, Segment, Severity, TensorInfo
from inspector.system.bytesource import ByteSource
from inspector.text import quoted

MOMENTS = ("exp_avg", "exp_avg_sq")
_MODEL_RE = re.compile(r"^(mp_rank_00|zero_pp_rank_0_mp_rank_00)_model_states\.pt$")
# other stages or TP shards (under ZeRO-3 each shard's data-parallel ranks write zero_pp_rank_D_mp_rank_TT)
_PARALLEL_RE = re.compile(
    r"^(zero_pp_rank_(0|[1-9][0-9]{0,17})_)?mp_rank_(0[1-9]|[1-9][0-9]{1,17})_model_states\.pt$"
)


def find_universal(path: str, tag: str | None, prefer: bool, source: ByteSource) -> str | None:
    """The universal folder `path` means, or None when it is not one. In a root holding both `latest` and
    `latest_universal` the ZeRO checkpoint wins, unless `prefer` (verify's OUT: it was written there).
    `latest_universal` is read like `latest`: through the confined source, its content never shown. `source`:
    the byte source chosen for what the user named (`remote.roots.source_at`)."""
    src = source
    path = src.absolute(path)  # a bucket prefix is asked the same questions, answered from its listings
    if tag is not None:
        if name_problem(tag):
            return None
        cand = os.path.join(path, tag)
        return cand if src.rooted(path).is_dir(os.path.join(cand, "zero")) else None
    if src.entry(os.path.join(path, "zero")) == "dir":
        return path
    if src.lexists(os.path.join(path, "latest_universal")) and (
        prefer or not src.lexists(os.path.join(path, "latest"))
    ):
        name = read_tag_file(src, path, "latest_universal")
        if name is None:
            return None
        cand = os.path.join(path, name)
        if src.rooted(path).is_dir(os.path.join(cand, "zero")):
            return cand
        raise NotACheckpointError(
            f"`latest_universal` in {path} names the tag {shown_tag(name)}, which is not a universal "
            "checkpoint folder inside it.",
            hint="Point at the universal folder itself.",
        )
    return None


def _segments(ref: TensorRef) -> tuple[Segment, ...]:
    return tuple(Segment(ref.path, off, n, ref.dtype) for off, n in ref.runs())


def _int(value: int | float | TensorRef | None) -> int | None:
    return item(value) if value is not None else None


def _frozen_missing(missing: list[str], folder: str) -> list[Finding]:
    """A warning naming frozen parameters the folder has no data for (DeepSpeed's stage-3 conversion writes
    none), or nothing."""
    if not missing:
        return []
    return [
        Finding(
            Severity.WARNING,
            "frozen-missing",
            f"{len(missing)} frozen parameter(s) have no data in this universal checkpoint "
            f"({', '.join(missing[:3])}); DeepSpeed's stage-3 conversion does not write them.",
            folder,
        )
    ]


def scan_universal(folder: str, source: ByteSource) -> Checkpoint:
    """The universal checkpoint in `folder`, through `source` (of the kind chosen for it) re-rooted there."""
    folder = source.absolute(folder)
    source = source.rooted(folder, "universal checkpoint")
    zero = os.path.join(folder, "zero")
    findings: list[Finding] = []
    models = [n for n in source.listdir(folder) if _MODEL_RE.match(n)]
    if not models:
        raise NotACheckpointError(
            f"{folder} has a zero/ folder but no mp_rank_00 or zero_pp_rank_0 model-states file.",
            hint="Copy the complete universal checkpoint folder.",
        )
    model_path = os.path.join(folder, models[0])
    model_tree = load_tree(model_path, source)
    model = ModelStates.parse(model_tree, model_path)
    shapes, parallel = _shapes(source, folder, model)
    shapes.update(_autoep_shapes(model_tree, model_path))
    module = model.module
    buffers = list(model.buffer_names)
    shared = model.shared_params
    frozen_shapes: Mapping[str, tuple[int, ...]] = model.frozen_param_shapes or {}
    names = source.listdir(zero) if source.is_dir(zero) else []
    files = [FileInfo.stat(os.path.join(folder, n), "model", None, 0, source) for n in models]
    tensors: dict[str, TensorInfo] = {}
    step: int | None = None
    for name in names:
        pdir = os.path.join(zero, name)
        if name_problem(name):
            findings.append(_unsafe_folder(name, zero))
            continue
        if not source.is_dir(pdir) or name in buffers or name in shared:
            continue  # DeepSpeed's stage-1/2 output also writes buffers and aliases, rounded to fp32
        try:
            fp32 = _param(source, pdir, "fp32")
            moments = {m: _param(source, pdir, m) for m in MOMENTS if _has(source, pdir, m)}
            if _has(source, pdir, "step") and step is None:
                path = os.path.join(pdir, "step.pt")
                step = _int(step_value(load_tree(path, source), path))
        except InspectorError as exc:
            findings.append(Finding(Severity.ERROR, "unreadable", exc.message, pdir, exc.hint))
            continue
        info = _param_tensor(
            name, pdir, fp32, moments, shapes, frozen_shapes, files, findings, source, parallel
        )
        if info is not None:
            tensors[name] = info
    _add_module_tensors(tensors, zero, shapes, buffers, module, shared, findings)
    findings += _frozen_missing([n for n in frozen_shapes if n not in tensors], folder)
    order = {n: i for i, n in enumerate([*module, *shapes])}
    ordered = sorted(tensors.values(), key=lambda t: (order.get(t.name, len(order)), t.name))
    osd = _optimizer_state(source, zero, files, findings)
    if step is None and osd is not None:
        step = _int(osd.step)
    return _checkpoint(folder, model, osd, ordered, files, findings, step)


def _shapes(source: ByteSource, folder: str, model: ModelStates) -> tuple[dict[str, tuple[int, ...]], bool]:
    """Every trainable parameter's shape as the model states record it, and whether other model-states files
    took part: a pipeline's later stages and a tensor-parallel run's other shards (a shard records its piece;
    the full shape is the one its fp32.pt holds)."""
    shapes: dict[str, tuple[int, ...]] = {n: s for group in (model.param_shapes or ()) for n, s in group}
    parallel = sorted(n for n in source.listdir(folder) if _PARALLEL_RE.match(n))
    for n in parallel:
        path = os.path.join(folder, n)
        for group in ModelStates.parse(load_tree(path, source), path).param_shapes or ():
            for name, shape in group:
                shapes.setdefault(name, shape)
    return shapes, bool(parallel)


def _autoep_shapes(model_tree: Any, path: str) -> dict[str, tuple[int, ...]]:
    """AutoEP: the model states record each expert weight's local shard (`[n_local, ...]`), while its universal
    files hold the whole `[num_experts, ...]` tensor: the logical shape its affine map records."""
    from inspector.parse.autoep import autoep_layers

    return {p.name: p.logical_shape for layer in autoep_layers(model_tree, path) or () for p in layer.params}


def _unsafe_folder(name: str, zero: str) -> Finding:
    return Finding(
        Severity.ERROR,
        "unsafe-name",
        f"zero/ holds a folder named {quoted(name)}, which is not a parameter name "
        f"({name_problem(name)}); it was not read.",
        zero,
        "Treat the checkpoint as crafted; copy it again from a source you trust.",
    )


def _param(source: ByteSource, pdir: str, state: str) -> TensorRef:
    path = os.path.join(pdir, f"{state}.pt")
    return param_tensor(load_tree(path, source), path)


def _param_tensor(
    name: str,
    pdir: str,
    fp32: TensorRef | None,
    moments: Mapping[str, TensorRef | None],
    shapes: dict[str, tuple[int, ...]],
    frozen_shapes: Mapping[str, Any],
    files: list[FileInfo],
    findings: list[Finding],
    source: ByteSource,
    sharded: bool = False,
) -> TensorInfo | None:
    """One zero/<name>/ folder as a tensor (its files appended to `files`); None, with a finding, when unusable.
    `sharded`: the model states are a tensor-parallel shard's, so a joined parameter's shape is its fp32.pt's;
    so is a native-MoE expert slot's, stacked on a new dim 0 (one entry per expert-parallel rank)."""
    if fp32 is None:
        findings.append(Finding(Severity.ERROR, "no-fp32", f"{name} has no readable fp32.pt.", pdir))
        return None
    files += [FileInfo.stat(os.path.join(pdir, f), "param", None, 0, source) for f in source.listdir(pdir)]
    shape = shapes.get(name) or frozen_shapes.get(name) or fp32.shape
    if fp32.shape and math.prod(shape) != fp32.numel and (sharded or tuple(fp32.shape[1:]) == tuple(shape)):
        shape = fp32.shape
    if math.prod(shape) != fp32.numel:
        findings.append(
            Finding(Severity.ERROR, "shape", f"{name}: {fp32.numel} elements, expected {shape}.", pdir)
        )
        return None
    trainable = name in shapes
    got = {m: r for m, r in moments.items() if r is not None and r.numel == fp32.numel}
    if trainable and len(got) != len(MOMENTS):
        findings.append(
            Finding(Severity.WARNING, "no-moments", f"{name} has no complete Adam moments.", pdir)
        )
    return TensorInfo(
        name,
        shape,
        fp32.dtype,
        Kind.TRAINABLE if trainable else Kind.FROZEN,
        _segments(fp32),
        moments=tuple((m, _segments(r)) for m, r in got.items()),
    )


def _add_module_tensors(
    tensors: dict[str, TensorInfo],
    zero: str,
    shapes: dict[str, tuple[int, ...]],
    buffers: list[str],
    module: Mapping[str, TensorRef],
    shared: Mapping[str, str],
    findings: list[Finding],
) -> None:
    """Flag trainable parameters without a folder; add buffers, module-only frozen parameters and aliases."""
    for name in shapes:
        if name not in tensors:
            findings.append(
                Finding(
                    Severity.ERROR, "missing-param", f"Trainable parameter {name} has no zero/ folder.", zero
                )
            )
    for name in buffers:
        ref = module.get(name)
        if isinstance(ref, TensorRef):
            tensors[name] = TensorInfo(name, ref.shape, ref.dtype, Kind.BUFFER, _segments(ref))
    for name, ref in module.items():  # frozen parameters that only the 16-bit module copy holds (stage 1/2)
        if name not in tensors and name not in shared and isinstance(ref, TensorRef) and ref.numel:
            tensors[name] = TensorInfo(name, ref.shape, ref.dtype, Kind.FROZEN, _segments(ref))
    for alias, owner in shared.items():
        src = tensors.get(owner)
        if src is not None:
            tensors[alias] = TensorInfo(
                alias, src.shape, src.dtype, Kind.TIED, src.segments, alias_of=owner, moments=src.moments
            )


def _optimizer_state(
    source: ByteSource, zero: str, files: list[FileInfo], findings: list[Finding]
) -> UniversalOptimizer | None:
    """zero/optimizer_state.pt, parsed (None with a finding when missing)."""
    opt_path = os.path.join(zero, "optimizer_state.pt")
    if not source.is_file(opt_path):
        findings.append(
            Finding(Severity.ERROR, "no-optimizer-state", "zero/optimizer_state.pt is missing.", zero)
        )
        return None
    files.append(FileInfo.stat(opt_path, "optim", None, 0, source))
    return UniversalOptimizer.parse(load_tree(opt_path, source), opt_path)


def _has(source: ByteSource, pdir: str, state: str) -> bool:
    return source.is_file(os.path.join(pdir, f"{state}.pt"))


def _checkpoint(
    folder: str,
    model: ModelStates,
    osd: UniversalOptimizer | None,
    tensors: list[TensorInfo],
    files: list[FileInfo],
    findings: list[Finding],
    step: int | None,
) -> Checkpoint:
    cfg = model.ds_config
    stage = cfg.zero_stage if cfg.zero_stage is not None else (3 if "zero_pp_rank" in files[0].path else 2)
    compute = cfg.compute_dtype or "float32"
    root, tag = os.path.split(folder)
    return record(
        Folder(root, tag, folder, "universal"),
        model,
        stage=stage,
        world_size=model.dp_world_size or 0,
        optimizer="universal",
        compute_dtype=compute,
        master_dtype="float32",
        optimizer_step=step,
        loss_scale=osd.loss_scale if osd else None,
        dynamic_loss_scale=osd.dynamic_loss_scale if osd else None,
        files=files,
        ranks=(),
        groups=(),
        tensors=tensors,
        findings=findings,
    )
