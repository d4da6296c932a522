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
from types import MappingProxyType
from typing import Any

from inspector.errors import InspectorError, NotACheckpointError
from inspector.format.torchzip import TensorRef, load_tree
from inspector.scan.metadata import item
from inspector.scan.model import Checkpoint, FileInfo, Finding, Kind, Segment, Severity, TensorInfo

MOMENTS = ("exp_avg", "exp_avg_sq")
_MODEL_RE = re.compile(r"^(mp_rank_00|zero_pp_rank_0_mp_rank_00)_model_states\.pt$")


def find_universal(path: str, tag: str | None = None, prefer: bool = False) -> str | None:
    """The universal folder `path` means, or None when it is not one. In a root holding both `latest` and
    `latest_universal` the ZeRO checkpoint wins, unless `prefer` (verify's OUT: it was written there)."""
    path = os.path.abspath(os.path.expanduser(path))
    if tag is not None:
        cand = os.path.join(path, tag)
        return cand if os.path.isdir(os.path.join(cand, "zero")) else None
    if os.path.isdir(os.path.join(path, "zero")):
        return path
    latest = os.path.join(path, "latest_universal")
    if os.path.isfile(latest) and (prefer or not os.path.isfile(os.path.join(path, "latest"))):
        with open(latest, "rb") as fh:
            name = fh.read(4096).decode("utf-8", "replace").strip()
        cand = os.path.join(path, name)
        if name and "/" not in name and name not in (".", "..") and os.path.isdir(os.path.join(cand, "zero")):
            return cand
        raise NotACheckpointError(
            f"`latest_universal` in {path} names {name!r}, which is not a universal checkpoint folder.",
            hint="Point at the universal folder itself.",
        )
    return None


def _segments(ref: TensorRef) -> tuple[Segment, ...]:
    return tuple(Segment(ref.path, off, n, ref.dtype) for off, n in ref.runs())


def _param_ref(path: str) -> TensorRef | None:
    tree = load_tree(path)
    if isinstance(tree, Mapping):
        tree = tree.get("param")
    return tree if isinstance(tree, TensorRef) else None


def _int(value: Any) -> int | None:
    if isinstance(value, TensorRef) and value.numel == 1:
        return item(value)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def scan_universal(folder: str) -> Checkpoint:
    folder = os.path.abspath(folder)
    zero = os.path.join(folder, "zero")
    findings: list[Finding] = []
    models = sorted(n for n in os.listdir(folder) if _MODEL_RE.match(n))
    if not models:
        raise NotACheckpointError(
            f"{folder} has a zero/ folder but no mp_rank_00 or zero_pp_rank_0 model-states file.",
            hint="Copy the complete universal checkpoint folder.",
        )
    model_path = os.path.join(folder, models[0])
    model = load_tree(model_path)
    if not isinstance(model, dict):
        raise NotACheckpointError(f"{model_path} is not a DeepSpeed model-states file.")
    shapes: dict[str, tuple[int, ...]] = {}
    for group in model.get("param_shapes") or []:
        shapes.update({n: tuple(int(d) for d in s) for n, s in group.items()})
    module: Mapping[str, Any] = model.get("module") or {}
    buffers = list(model.get("buffer_names") or [])
    shared: Mapping[str, str] = model.get("shared_params") or {}
    frozen_shapes: Mapping[str, Any] = model.get("frozen_param_shapes") or {}
    names = sorted(os.listdir(zero)) if os.path.isdir(zero) else []
    files = [FileInfo.stat(os.path.join(folder, n), "model", None) for n in models]
    tensors: dict[str, TensorInfo] = {}
    step: int | None = None
    for name in names:
        pdir = os.path.join(zero, name)
        if not os.path.isdir(pdir) or name in buffers or name in shared:
            continue  # DeepSpeed's stage-1/2 output also writes buffers and aliases, rounded to fp32
        try:
            fp32 = _param_ref(os.path.join(pdir, "fp32.pt"))
            moments = {m: _param_ref(os.path.join(pdir, f"{m}.pt")) for m in MOMENTS if _has(pdir, m)}
            if _has(pdir, "step") and step is None:
                step = _int(load_tree(os.path.join(pdir, "step.pt")))
        except InspectorError as exc:
            findings.append(Finding(Severity.ERROR, "unreadable", exc.message, pdir, exc.hint))
            continue
        info = _param_tensor(name, pdir, fp32, moments, shapes, frozen_shapes, files, findings)
        if info is not None:
            tensors[name] = info
    _add_module_tensors(tensors, zero, shapes, buffers, module, shared, findings)
    missing_frozen = [n for n in frozen_shapes if n not in tensors]
    if missing_frozen:
        findings.append(
            Finding(
                Severity.WARNING,
                "frozen-missing",
                f"{len(missing_frozen)} frozen parameter(s) have no data in this universal checkpoint "
                f"({', '.join(missing_frozen[:3])}); DeepSpeed's stage-3 conversion does not write them.",
                folder,
            )
        )
    order = {n: i for i, n in enumerate([*module, *shapes])}
    ordered = sorted(tensors.values(), key=lambda t: (order.get(t.name, len(order)), t.name))
    osd = _optimizer_state(zero, files, findings)
    if step is None and isinstance(osd, dict):
        state = (osd.get("optimizer_state_dict") or {}).get("state") or {}
        first = next(iter(state.values()), None) if isinstance(state, dict) else None
        step = _int(first.get("step")) if isinstance(first, dict) else None
    return _checkpoint(folder, model, osd, ordered, files, findings, step)


def _param_tensor(
    name: str,
    pdir: str,
    fp32: TensorRef | None,
    moments: dict[str, TensorRef | None],
    shapes: dict[str, tuple[int, ...]],
    frozen_shapes: Mapping[str, Any],
    files: list[FileInfo],
    findings: list[Finding],
) -> TensorInfo | None:
    """One zero/<name>/ folder as a tensor (its files appended to `files`); None, with a finding, when unusable."""
    if fp32 is None:
        findings.append(Finding(Severity.ERROR, "no-fp32", f"{name} has no readable fp32.pt.", pdir))
        return None
    files += [FileInfo.stat(os.path.join(pdir, f), "param", None) for f in sorted(os.listdir(pdir))]
    shape = shapes.get(name) or (tuple(frozen_shapes[name]) if name in frozen_shapes else fp32.shape)
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
    module: Mapping[str, Any],
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


def _optimizer_state(zero: str, files: list[FileInfo], findings: list[Finding]) -> Any:
    """zero/optimizer_state.pt as a tree ({} with a finding when missing)."""
    opt_path = os.path.join(zero, "optimizer_state.pt")
    osd: Any = load_tree(opt_path) if os.path.isfile(opt_path) else {}
    if os.path.isfile(opt_path):
        files.append(FileInfo.stat(opt_path, "optim", None))
    else:
        findings.append(
            Finding(Severity.ERROR, "no-optimizer-state", "zero/optimizer_state.pt is missing.", zero)
        )
    return osd


def _has(pdir: str, state: str) -> bool:
    return os.path.isfile(os.path.join(pdir, f"{state}.pt"))


def _checkpoint(
    folder: str,
    model: dict[str, Any],
    osd: Any,
    tensors: list[TensorInfo],
    files: list[FileInfo],
    findings: list[Finding],
    step: int | None,
) -> Checkpoint:
    raw_cfg = model.get("ds_config")
    cfg: dict[str, Any] = raw_cfg if isinstance(raw_cfg, dict) else {}
    raw_z = cfg.get("zero_optimization")
    zcfg: dict[str, Any] = raw_z if isinstance(raw_z, dict) else {}
    raw_stage = zcfg.get("stage")
    stage: int = raw_stage if isinstance(raw_stage, int) else (3 if "zero_pp_rank" in files[0].path else 2)
    compute = next(
        (v for k, v in (("bf16", "bfloat16"), ("fp16", "float16")) if (cfg.get(k) or {}).get("enabled")),
        "float32",
    )
    scaler = osd.get("loss_scaler") if isinstance(osd, dict) else None
    root, tag = os.path.split(folder)
    version = model.get("ds_version")
    ws = model.get("dp_world_size")
    return Checkpoint(
        root=root,
        tag=tag,
        tags=(tag,),
        tag_dir=folder,
        layout="universal",
        stage=stage,
        world_size=ws if isinstance(ws, int) else 0,
        optimizer="universal",
        compute_dtype=compute,
        master_dtype="float32",
        deepspeed_version=version if isinstance(version, str) else None,
        global_steps=_int(model.get("global_steps")),
        global_samples=_int(model.get("global_samples")),
        optimizer_step=step,
        loss_scale=float(scaler.get("cur_scale"))
        if scaler is not None and hasattr(scaler, "get") and isinstance(scaler.get("cur_scale"), int | float)
        else None,
        dynamic_loss_scale=bool(osd.get("dynamic_loss_scale"))
        if isinstance(osd, dict) and "dynamic_loss_scale" in osd
        else None,
        files=tuple(files),
        ranks=(),
        groups=(),
        tensors=tuple(tensors),
        findings=tuple(findings),
        ds_config=MappingProxyType(dict(cfg)),
    )
