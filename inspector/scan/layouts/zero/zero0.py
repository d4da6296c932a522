"""Plain data parallel with ZeRO off (`zero_optimization.stage` 0; FORMAT.md "More DeepSpeed layouts").

Only `mp_rank_00_model_states.pt` is written; every rank holds the same full model. In fp16/bf16 its
`optimizer` is FP16_UnfusedOptimizer's state (torch's Adam, as on the CPU): one full fp32 master per parameter
in `fp32_groups`, without names, in the module's parameter order, the Adam moments keyed by the same running
index (`parse.layers.UnfusedFp16`, shared with the ZeRO-off pipeline and MoE scans). In fp32 the module's
weights are the masters and `optimizer` is the torch optimizer's own state dict (`parse.layers.TorchOptimizer`).

Names come from the order and are proven, never assumed: every shape must follow the module's parameters in
sequence and, in 16 bits, every module copy must be its matched master cast (the optimizer copies masters
into the module after each step). FP16_Optimizer (DeepSpeed's FusedAdam) keeps one flat fp32 block per group
instead, with flat moments: it is cut at the module's parameter sizes and proven the same way.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from inspector.errors import UnsupportedCheckpointError
from inspector.format.torchzip import TensorRef
from inspector.parse.layers import ParallelDims
from inspector.parse.states import ModelStates
from inspector.parse.zero_off import TorchOptimizer, UnfusedFp16, UnfusedParam
from inspector.scan.assemble import record
from inspector.scan.files import RankFiles
from inspector.scan.layouts.base import tree_at
from inspector.scan.layouts.pipeline.names import plain, with_copy
from inspector.scan.locate import Location
from inspector.scan.metadata import file_size, item
from inspector.scan.model import (
    Checkpoint,
    FileInfo,
    Finding,
    GroupInfo,
    Kind,
    RankGroup,
    RankInfo,
    Segment,
    Severity,
    TensorInfo,
)
from inspector.scan.parallel_checks import CopyChecks

_HINT = (
    "Save with ZeRO stage 1 or 2, whose optimizer files name every parameter; the module holds the weights."
)
Named = list[tuple[str, TensorRef]]


def is_zero0(files: RankFiles) -> bool:
    """A tag folder with one model-states file and no optimizer, ZeRO-3 or expert files."""
    return files.model is not None and not files.optim and not files.zero3_model and not files.experts


def scan_zero0(
    loc: Location, files: RankFiles, *, shard: bool = False, trees: dict[str, Any] | None = None
) -> Checkpoint | None:
    """The checkpoint (with `shard`, one tensor-parallel rank's, which `scan.tensor` joins), or None when the
    model states hold no ZeRO-off optimizer this reads (weights only, or a model-parallel run missing its
    other ranks): the caller's ZeRO scan then says why."""
    assert files.model is not None
    tree = tree_at({} if trees is None else trees, files.model, loc.source)  # `Found.trees`: loaded once
    if ParallelDims.parse(tree, files.model).model_parallel > 1 and not shard:
        return None
    model = ModelStates.parse(tree, files.model)
    unfused = UnfusedFp16.parse(tree, files.model)
    torch_opt = TorchOptimizer.parse(tree, files.model) if unfused is None or unfused.plain else None
    if unfused is not None and unfused.plain:  # fp32: the module's weights are the masters (below)
        unfused = None
    if unfused is None and torch_opt is None:
        return None
    findings: list[Finding] = [*loc.findings, *files.findings]
    params: Named = [(n, r) for n, r in model.module.items() if n not in model.buffer_names]
    if unfused is not None and unfused.fused:
        unfused = _cut(unfused, params, loc)
    if unfused is not None:
        tensors, groups = _unfused(unfused, params, findings, loc)
    else:
        assert torch_opt is not None
        tensors, groups = _fp32(torch_opt, params, findings)
    named = {t.name for t in tensors}
    tensors += [plain(n, r, Kind.BUFFER) for n, r in model.module.items() if n in model.buffer_names]
    if tensors and not any(f.severity is Severity.ERROR for f in findings):
        tensors += [plain(n, r, Kind.FROZEN) for n, r in params if n not in named]
    return _record(loc, files.model, model, unfused, torch_opt, tensors, groups, findings)


def _cut(opt: UnfusedFp16, params: Named, loc: Location) -> UnfusedFp16:
    """FP16_Optimizer's flat blocks (and their flat moments) cut into one view per module parameter, in
    order: the sizes are the only boundaries written, so each block must end exactly where a parameter does;
    the names are then proven like the unfused masters' (by their 16-bit copies)."""
    groups: list[tuple[UnfusedParam, ...]] = []
    rest = list(params)
    for block in opt.flats:
        cut: list[UnfusedParam] = []
        at, flat = 0, _master(block)
        while rest and at < flat.numel and at + rest[0][1].numel <= flat.numel:
            shape = rest.pop(0)[1].shape
            cut.append(
                UnfusedParam(_view(flat, at, shape), _views(block.moments, at, shape), block.step)
            )
            at += _master(cut[-1]).numel
        if at != flat.numel or len(flat.shape) != 1 or not flat.is_contiguous():
            raise UnsupportedCheckpointError(
                f"{loc.tag_dir}: ZeRO off with FP16_Optimizer: a flat fp32 block of {flat.numel:,} "
                "elements does not end where the module's parameters do, so it cannot be cut into them safely.",
                hint=_HINT,
            )
        groups.append(tuple(cut))
    return replace(opt, groups=tuple(groups))


def _view(flat: TensorRef, at: int, shape: tuple[int, ...]) -> TensorRef:
    """Elements [at, at + numel) of a contiguous 1-D block, as a contiguous tensor of `shape`."""
    strides = tuple(math.prod(shape[i + 1 :]) for i in range(len(shape)))
    return TensorRef(flat.storage, flat.storage_offset + at, shape, strides, flat.dtype)


def _views(
    moments: Mapping[str, TensorRef] | None, at: int, shape: tuple[int, ...]
) -> Mapping[str, TensorRef] | None:
    return None if moments is None else {m: _view(v, at, shape) for m, v in moments.items()}


def _master(p: UnfusedParam) -> TensorRef:
    """An FP16 optimizer's fp32 master (only a plain torch optimizer's state has none, read elsewhere)."""
    assert p.master is not None
    return p.master


def _refuse(findings: list[Finding], file: str, message: str) -> tuple[list[TensorInfo], list[GroupInfo]]:
    findings.append(Finding(Severity.ERROR, "unnamed-params", message, file, _HINT))
    return [], []


def _unfused(
    opt: UnfusedFp16, params: Named, findings: list[Finding], loc: Location
) -> tuple[list[TensorInfo], list[GroupInfo]]:
    """Each fp32 master under the module parameter it follows in order, proven by shape and by its copy."""
    masters = [(g, p) for g, group in enumerate(opt.groups) for p in group]
    if len(masters) != len(params):
        return _refuse(
            findings,
            opt.file,
            f"The optimizer holds {len(masters)} unnamed fp32 masters for {len(params)} module parameters "
            "(frozen parameters?), so they cannot be matched to names by order safely.",
        )
    with CopyChecks(loc.source) as copies:  # each file opened once for every copy's proof
        return _proved(masters, params, findings, opt, copies)


def _proved(
    masters: list[tuple[int, UnfusedParam]], params: Named, findings: list[Finding], opt: UnfusedFp16, copies: CopyChecks
) -> tuple[list[TensorInfo], list[GroupInfo]]:
    """The masters named in order, each proven by its shapes and its copy (`_unfused`)."""
    out: list[TensorInfo] = []
    for (g, p), (name, ref) in zip(masters, params, strict=True):
        moments = tuple((m, _segs(v)) for m, v in (p.moments or {}).items())
        master = _master(p)
        t = TensorInfo(name, master.shape, "float32", Kind.TRAINABLE, _segs(master), None, g, moments)
        t = with_copy(t, ref)
        wrong_shape = master.shape != ref.shape or any(
            v.shape != ref.shape for v in (p.moments or {}).values()
        )
        if wrong_shape or not t.module_copy or copies.not_cast(t, t.module_copy):
            return _refuse(
                findings,
                opt.file,
                f"The fp32 master matched to {name} by order is not what its 16-bit copy holds (shape "
                f"{master.shape} against {ref.shape}): the optimizer's parameter order is not the module's, "
                "so the masters cannot be named safely.",
            )
        out.append(t)
    return out, _groups(out, opt.hyperparams)


def _fp32(
    opt: TorchOptimizer, params: Named, findings: list[Finding]
) -> tuple[list[TensorInfo], list[GroupInfo]]:
    """The module's fp32 weights as the masters, with the moments the torch optimizer keeps by index."""
    order = sorted(i for group in opt.groups for i in group)
    if order != list(range(len(params))):
        return _refuse(
            findings,
            opt.file,
            f"The torch optimizer's groups index {len(order)} parameters, not the module's {len(params)} in "
            "order (frozen parameters?), so its moments cannot be matched to names safely.",
        )
    out: list[TensorInfo] = []
    for g, group in enumerate(opt.groups):
        for i in group:
            name, ref = params[i]
            found, _ = opt.moments[i]
            if ref.dtype != "float32" or any(v.shape != ref.shape for v in (found or {}).values()):
                return _refuse(
                    findings,
                    opt.file,
                    f"{name} is {ref.dtype} {ref.shape} but its torch optimizer state (index {i}) does not "
                    "match it: not an fp32 run's state.",
                )
            moments = tuple((m, _segs(v)) for m, v in (found or {}).items())
            out.append(TensorInfo(name, ref.shape, "float32", Kind.TRAINABLE, _segs(ref), None, g, moments))
    return out, _groups(out, opt.hyperparams)


def _groups(tensors: Sequence[TensorInfo], hyper: Sequence[Mapping[str, Any]]) -> list[GroupInfo]:
    """One group record per optimizer group (nothing is partitioned: every element is stored, none padded)."""
    out = []
    for g in sorted({t.group for t in tensors if t.group is not None}):
        mine = [t for t in tensors if t.group == g]
        numel = sum(t.numel for t in mine)
        out.append(GroupInfo(g, len(mine), numel, numel, numel, dict(hyper[g]) if g < len(hyper) else {}))
    return out


def _record(
    loc: Location,
    path: str,
    model: ModelStates,
    unfused: UnfusedFp16 | None,
    torch_opt: TorchOptimizer | None,
    tensors: list[TensorInfo],
    groups: list[GroupInfo],
    findings: list[Finding],
) -> Checkpoint:
    copies = [t.module_copy[0].dtype for t in tensors if t.module_copy]
    rank0 = RankInfo(
        0, None, path, 0, file_size(path), tuple(RankGroup(g.index, g.numel, g.numel, 0) for g in groups)
    )
    if unfused is not None:
        first = unfused.groups[0][0] if unfused.groups and unfused.groups[0] else None
        step = item(first.step) if first else None
    else:
        assert torch_opt is not None
        first_moments = next(iter(torch_opt.moments.values()), None)  # the first's counter: each read opens
        step = item(first_moments[1]) if first_moments else None  # its file (it was every parameter's)
    return record(
        loc,
        model,
        stage=0,
        world_size=model.dp_world_size or 1,
        optimizer=(
            "torch optimizer (ZeRO off)"
            if unfused is None
            else "FP16_Optimizer"
            if unfused.fused
            else "FP16_UnfusedOptimizer"
        ),
        compute_dtype=copies[0] if copies else "float32",
        master_dtype="float32",
        optimizer_step=step,
        loss_scale=unfused.loss_scale if unfused is not None else None,
        dynamic_loss_scale=None,
        files=[FileInfo.stat(path, "model", None, source=loc.source)],
        ranks=[rank0],
        groups=groups,
        tensors=tensors,
        findings=findings,
        module_copy_bytes=sum(s.nbytes for t in tensors for s in t.module_copy),
    )


def _segs(ref: TensorRef) -> tuple[Segment, ...]:
    return tuple(Segment(ref.path, off, n, ref.dtype) for off, n in ref.runs())


__all__ = ["is_zero0", "scan_zero0"]
