"""Scan a DeepSpeed ZeRO checkpoint into a `Checkpoint`: metadata only, no tensor data.

Follows FORMAT.md §3: stage 1/2 flat groups partitioned by rank (rebuilt from `param_shapes`, never from
`param_slice_mappings`), stage 3 per-parameter partitions, frozen parameters, tied aliases and buffers.
"""

from __future__ import annotations

import math
import os
import struct
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from inspector.errors import (
    CorruptFileError,
    InspectorError,
    NotACheckpointError,
    UnsupportedCheckpointError,
)
from inspector.format.torchzip import TensorRef, load_tree
from inspector.scan.layout import Layout, stage3_layout, stage12_layout
from inspector.scan.locate import (
    EXPERT_RE,
    EXPP_RE,
    LAYER_RE,
    MODEL_RE,
    OPTIM_RE,
    ZERO3_MODEL_RE,
    Location,
    locate,
)
from inspector.scan.model import (
    Checkpoint,
    FileInfo,
    Finding,
    GroupInfo,
    Kind,
    RankInfo,
    Segment,
    Severity,
    TensorInfo,
)


@dataclass
class _Files:
    optim: dict[int, str] = field(default_factory=dict)
    zero3_model: dict[int, str] = field(default_factory=dict)
    model: str | None = None
    findings: list[Finding] = field(default_factory=list)


def _classify(tag_dir: str) -> _Files:
    """Sort a tag folder's files by role and DP rank; reject layouts we do not read yet."""
    names = sorted(os.listdir(tag_dir))
    files = _Files()
    mp_ranks: set[int] = set()
    layers = [n for n in names if LAYER_RE.match(n)]
    experts = [n for n in names if EXPERT_RE.match(n) or EXPP_RE.match(n)]
    if layers:
        raise UnsupportedCheckpointError(
            f"{tag_dir} is a pipeline-parallel checkpoint ({len(layers)} layer_*-model_states.pt files).",
            hint="Pipeline-parallel (PipelineModule) checkpoints are not supported yet.",
        )
    if experts:
        raise UnsupportedCheckpointError(
            f"{tag_dir} is a native MoE checkpoint ({len(experts)} expert files such as {experts[0]}).",
            hint="Mixture-of-experts checkpoints are not supported yet.",
        )
    for n in names:
        path = os.path.join(tag_dir, n)
        if m := OPTIM_RE.match(n):
            dp, mp = int(m.group(2)), int(m.group(3))
            mp_ranks.add(mp)
            if mp == 0:
                if dp in files.optim:
                    files.findings.append(
                        Finding(
                            Severity.ERROR,
                            "duplicate-rank",
                            f"Two optimizer files for DP rank {dp}: {os.path.basename(files.optim[dp])} and {n}.",
                            path,
                            "Files from two runs were mixed; keep only the files of one run.",
                        )
                    )
                files.optim[dp] = path
        elif m := ZERO3_MODEL_RE.match(n):
            mp_ranks.add(int(m.group(2)))
            if int(m.group(2)) == 0:
                files.zero3_model[int(m.group(1))] = path
        elif m := MODEL_RE.match(n):
            mp_ranks.add(int(m.group(1)))
            if int(m.group(1)) == 0:
                files.model = path
    if len(mp_ranks) > 1:
        raise UnsupportedCheckpointError(
            f"{tag_dir} has {len(mp_ranks)} model-parallel ranks (mp_rank_00..{max(mp_ranks):02d}).",
            hint="Tensor/model-parallel checkpoints hold shards that need model-specific merge rules; "
            "not supported yet.",
        )
    return files


def _missing_ranks(found: dict[int, str], expected: int, what: str, tag_dir: str) -> list[Finding]:
    out = []
    for r in range(expected):
        if r not in found:
            out.append(
                Finding(
                    Severity.ERROR,
                    "missing-rank",
                    f"The {what} file for DP rank {r} is missing.",
                    tag_dir,
                    "Copy the complete checkpoint folder; every rank writes its own file.",
                )
            )
    return out


def _load(path: str, findings: list[Finding]) -> Any:
    try:
        return load_tree(path)
    except InspectorError as exc:
        findings.append(Finding(Severity.ERROR, "unreadable", exc.message, path, exc.hint))
        return None


def _dtype_of(tensors: Mapping[str, Any]) -> str | None:
    for v in tensors.values():
        if isinstance(v, TensorRef) and v.dtype in ("bfloat16", "float16", "float32"):
            return v.dtype
    return None


_SCALAR_FORMATS = {
    "float32": "<f",
    "float64": "<d",
    "float16": "<e",
    "int64": "<q",
    "int32": "<i",
    "int16": "<h",
    "int8": "<b",
    "uint8": "<B",
}


def _item(value: Any) -> int | None:
    """A step counter: int, float or a 0-d TensorRef (read its few bytes with pread; no torch import)."""
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, TensorRef) and value.numel == 1:
        value = _read_scalar(value)
    if isinstance(value, int):
        return value
    if isinstance(value, float) and math.isfinite(value):
        return int(value)
    return None


def _read_scalar(ref: TensorRef) -> float | int | None:
    fmt = "<f" if ref.dtype == "bfloat16" else _SCALAR_FORMATS.get(ref.dtype)
    if fmt is None:
        return None
    ((offset, _count),) = ref.runs()
    fd = os.open(ref.path, os.O_RDONLY)
    try:
        raw = os.pread(fd, ref.itemsize, offset)
    finally:
        os.close(fd)
    if len(raw) != ref.itemsize:
        raise CorruptFileError(
            f"{ref.path}: the file ends inside a tensor at byte {offset}; it is truncated."
        )
    value: float | int = struct.unpack(fmt, b"\0\0" + raw if ref.dtype == "bfloat16" else raw)[0]
    return value


def scan(path: str, tag: str | None = None) -> Checkpoint:
    """Scan `path` (root, tag folder, Trainer run, Lightning .ckpt or universal checkpoint) into a `Checkpoint`."""
    from inspector.scan.universal import find_universal, scan_universal

    if (uni := find_universal(path, tag)) is not None:
        return scan_universal(uni)
    loc = locate(path, tag)
    files = _classify(loc.tag_dir)
    return _Scanner(loc, files).build()


class _Scanner:
    def __init__(self, loc: Location, files: _Files) -> None:
        self.loc = loc
        self.files = files
        self.findings: list[Finding] = list(loc.findings) + files.findings

    def add(
        self, severity: Severity, code: str, message: str, file: str | None = None, hint: str = ""
    ) -> None:
        self.findings.append(Finding(severity, code, message, file, hint))

    def build(self) -> Checkpoint:
        f = self.files
        tag_dir = self.loc.tag_dir
        stage3 = bool(f.zero3_model)
        model_path = f.zero3_model.get(0) if stage3 else f.model
        if model_path is None:
            if stage3:
                raise NotACheckpointError(
                    f"{tag_dir}: the rank-0 model file zero_pp_rank_0_mp_rank_00_model_states.pt is missing.",
                    hint="Copy the complete checkpoint folder.",
                )
            raise NotACheckpointError(
                f"{tag_dir}: no mp_rank_00_model_states.pt.",
                hint="Copy the complete checkpoint folder; DP rank 0 writes this file.",
            )
        if not f.optim:
            raise NotACheckpointError(
                f"{tag_dir} has model files but no *_optim_states.pt files.",
                hint="This is not a ZeRO checkpoint (ZeRO off, or optimizer states were not saved); its model "
                "file already holds the full weights.",
            )
        model = load_tree(model_path)  # the rank-0 model states are essential: errors propagate
        if not isinstance(model, dict) or "module" not in model:
            raise NotACheckpointError(f"{model_path} is not a DeepSpeed model-states file (no 'module' key).")
        if model.get("module") is None:
            raise UnsupportedCheckpointError(
                f"{model_path} has no module weights (pipeline-parallel run).",
                hint="Pipeline-parallel checkpoints are not supported yet.",
            )
        ws = max(f.optim) + 1
        dp_ws = model.get("dp_world_size")
        if isinstance(dp_ws, int) and dp_ws > ws:
            ws = dp_ws
        self.findings += _missing_ranks(f.optim, ws, "optimizer", tag_dir)
        if stage3:
            self.findings += _missing_ranks(f.zero3_model, ws, "model-states", tag_dir)
        optims = {r: _load(p, self.findings) for r, p in sorted(f.optim.items())}
        models = {0: model}
        if stage3:
            models.update({r: _load(p, self.findings) for r, p in sorted(f.zero3_model.items()) if r != 0})
        osd0 = self._optimizer_state(optims)
        layout: Layout | None = None
        version = model.get("ds_version")
        self._check_consistency(model, models, optims, version)
        complete = all(optims.get(r) is not None for r in range(ws)) and (
            not stage3 or all(models.get(r) is not None for r in range(ws))
        )
        param_shapes = model.get("param_shapes") or (osd0 or {}).get("param_shapes")
        if osd0 is not None and complete and param_shapes:
            osds = [optims[r]["optimizer_state_dict"] for r in range(ws)]
            try:
                if stage3:
                    layout = stage3_layout(param_shapes, osds, [f.optim[r] for r in range(ws)])
                else:
                    layout = stage12_layout(param_shapes, osds, [f.optim[r] for r in range(ws)])
            except InspectorError as exc:
                self.add(Severity.ERROR, "layout", exc.message, tag_dir, exc.hint)
            if layout is not None:
                self.findings += layout.findings
        elif not param_shapes and osd0 is not None:
            self.add(
                Severity.ERROR,
                "no-param-shapes",
                "The model states hold no param_shapes, so the flat "
                "optimizer partitions cannot be split into parameters.",
                model_path,
                "This checkpoint predates DeepSpeed 0.3.14 or was not written by a ZeRO engine.",
            )
        elif not complete:
            self.add(
                Severity.ERROR,
                "incomplete",
                "Trainable parameters cannot be rebuilt because rank files "
                "are missing or unreadable (see above).",
                tag_dir,
            )
        tensors = self._tensors(model, models, layout, ws, stage3)
        return self._checkpoint(model, optims, osd0, layout, tensors, ws, stage3, version)

    def _optimizer_state(self, optims: dict[int, Any]) -> dict[str, Any] | None:
        for r, tree in optims.items():
            if tree is None:
                continue
            osd = tree.get("optimizer_state_dict") if isinstance(tree, dict) else None
            if not isinstance(osd, dict):
                self.add(
                    Severity.ERROR,
                    "bad-optim",
                    "This file has no optimizer_state_dict.",
                    self.files.optim[r],
                    "It is not a DeepSpeed ZeRO optimizer file.",
                )
                optims[r] = None
                continue
        first = next((t for t in optims.values() if t is not None), None)
        return first["optimizer_state_dict"] if first else None

    def _check_consistency(
        self, model: dict[str, Any], models: dict[int, Any], optims: dict[int, Any], version: Any
    ) -> None:
        """Files of one checkpoint agree on version, config and step; mixed runs do not."""

        def sig(tree: Any) -> tuple[Any, ...]:
            osd = tree.get("optimizer_state_dict", {}) if isinstance(tree, dict) else {}
            return (tree.get("ds_version"), _digest(tree.get("ds_config")), _digest(_group_steps(osd)))

        sigs = {r: sig(t) for r, t in optims.items() if t is not None}
        if len({s[:2] for s in sigs.values()}) > 1 or len({s[2] for s in sigs.values()}) > 1:
            base = sigs[min(sigs)]
            odd = [r for r, s in sigs.items() if s != base]
            self.add(
                Severity.ERROR,
                "mixed-runs",
                f"Optimizer files disagree on DeepSpeed version, config or step (ranks {odd} differ from "
                f"rank {min(sigs)}): files from different runs or tags are mixed together.",
                self.loc.tag_dir,
                "Restore the tag folder from one save; do not merge folders.",
            )
        model_sig = (model.get("ds_version"), _digest(model.get("ds_config")))
        if sigs and model_sig != sigs[min(sigs)][:2]:
            self.add(
                Severity.ERROR,
                "mixed-runs",
                "The model-states file and the optimizer files come from "
                "different runs (version or config differ).",
                self.loc.tag_dir,
                "Restore the tag folder from one save; do not merge folders.",
            )
        steps = {r: m.get("global_steps") for r, m in models.items() if isinstance(m, dict)}
        shapes = {r: _digest(m.get("param_shapes")) for r, m in models.items() if isinstance(m, dict)}
        if len(set(steps.values())) > 1 or len(set(shapes.values())) > 1:
            self.add(
                Severity.ERROR,
                "mixed-runs",
                f"Stage-3 model files disagree on global_steps or parameter shapes ({steps}).",
                self.loc.tag_dir,
                "Restore the tag folder from one save.",
            )

    def _tensors(
        self, model: dict[str, Any], models: dict[int, Any], layout: Layout | None, ws: int, stage3: bool
    ) -> list[TensorInfo]:
        module: Mapping[str, Any] = model.get("module") or {}
        buffer_names = list(model.get("buffer_names") or [])
        shared: Mapping[str, str] = model.get("shared_params") or {}
        frozen_shapes: Mapping[str, Any] | None = model.get("frozen_param_shapes")
        trainable = layout.params if layout else {}
        owned = {n for group in (model.get("param_shapes") or []) for n in group}
        out: dict[str, TensorInfo] = {}
        order = list(module) + [n for n in trainable if n not in module]
        for name in order:
            if name in trainable:
                out[name] = trainable[name]
            elif name in buffer_names:
                out[name] = self._plain(name, module[name], Kind.BUFFER)
            elif name in shared:
                continue  # aliases below, once owners are known
            elif name in owned:
                continue  # a trainable parameter we could not rebuild (reported already)
            else:
                t = self._frozen(name, module.get(name), models, frozen_shapes, ws, stage3)
                if t is not None:
                    out[name] = t
        for name in buffer_names:
            if name not in module:
                self.add(
                    Severity.WARNING,
                    "missing-buffer",
                    f"Buffer {name} is listed in buffer_names but not saved in the module state.",
                    None,
                )
        for alias, owner in shared.items():
            src = out.get(owner)
            if src is None:
                if layout is not None:
                    self.add(
                        Severity.WARNING,
                        "dangling-alias",
                        f"Tied parameter {alias} points to {owner}, "
                        "which is not in the checkpoint; left out.",
                    )
                continue
            out[alias] = TensorInfo(
                alias,
                src.shape,
                src.dtype,
                Kind.TIED,
                src.segments,
                alias_of=owner,
                group=src.group,
                moments=src.moments,
            )
        pos = {n: i for i, n in enumerate(order)}
        return sorted(out.values(), key=lambda t: pos.get(t.name, len(pos)))

    def _plain(self, name: str, ref: Any, kind: Kind) -> TensorInfo:
        if not isinstance(ref, TensorRef):
            raise NotACheckpointError(f"module[{name!r}] is not a tensor.")
        segs = tuple(Segment(ref.path, off, n, ref.dtype) for off, n in ref.runs())
        return TensorInfo(name, ref.shape, ref.dtype, kind, segs)

    def _frozen(
        self,
        name: str,
        ref: Any,
        models: dict[int, Any],
        frozen_shapes: Mapping[str, Any] | None,
        ws: int,
        stage3: bool,
    ) -> TensorInfo | None:
        """Frozen params: full 16-bit tensor (stage 1 `module`, stage 2 fragments) or per-rank slices (stage 3)."""
        shape = (
            tuple(frozen_shapes[name])
            if frozen_shapes and name in frozen_shapes
            else (ref.shape if isinstance(ref, TensorRef) else None)
        )
        if shape is None:
            return None
        numel = 1
        for d in shape:
            numel *= d
        if not stage3:
            frag = (models[0].get("frozen_param_fragments") or {}).get(name, ref)
            if not isinstance(frag, TensorRef) or frag.numel != numel:
                self.add(Severity.ERROR, "missing-frozen", f"Frozen parameter {name} has no saved data.")
                return None
            t = self._plain(name, frag, Kind.FROZEN)
            return TensorInfo(name, shape, t.dtype, Kind.FROZEN, t.segments)
        part = -(-numel // ws) if ws else 0
        segs: list[Segment] = []
        dtype = ref.dtype if isinstance(ref, TensorRef) else "bfloat16"
        for r in range(ws):
            frag = ((models.get(r) or {}).get("frozen_param_fragments") or {}).get(name)
            take = max(0, min(part, numel - r * part))
            if not isinstance(frag, TensorRef) or frag.numel < take:
                self.add(
                    Severity.ERROR,
                    "missing-frozen",
                    f"Rank {r} lacks its slice of frozen parameter {name}.",
                    self.files.zero3_model.get(r),
                )
                return None
            dtype = frag.dtype
            if take:
                segs.append(Segment(frag.path, frag.offset, take, frag.dtype))
        return TensorInfo(name, shape, dtype, Kind.FROZEN, tuple(segs))

    def _checkpoint(
        self,
        model: dict[str, Any],
        optims: dict[int, Any],
        osd0: dict[str, Any] | None,
        layout: Layout | None,
        tensors: list[TensorInfo],
        ws: int,
        stage3: bool,
        version: Any,
    ) -> Checkpoint:
        f = self.files
        raw_config = model.get("ds_config")
        ds_config: dict[str, Any] = raw_config if isinstance(raw_config, dict) else {}
        zstage = (osd0 or {}).get("zero_stage")
        cfg_stage = (
            (ds_config.get("zero_optimization") or {}).get("stage")
            if isinstance(ds_config.get("zero_optimization"), dict)
            else None
        )
        if stage3:
            stage = 3
        elif isinstance(cfg_stage, int) and cfg_stage in (1, 2):
            stage = cfg_stage
        elif zstage is not None:
            stage = int(zstage)
        else:
            stage = 1
        if osd0 is not None and "zero_stage" not in osd0 and not stage3:
            optimizer = "BF16_Optimizer"
        else:
            optimizer = "DeepSpeedZeroOptimizer_Stage3" if stage3 else "DeepSpeedZeroOptimizer"
        module = model.get("module") or {}
        compute = (
            "bfloat16"
            if any(os.path.basename(p).startswith("bf16_") for p in f.optim.values())
            else _dtype_of({n: v for n, v in module.items() if n not in (model.get("buffer_names") or [])})
            or "float32"
        )
        buffers = set(model.get("buffer_names") or [])
        # the 16-bit weights DeepSpeed keeps beside the fp32 masters: whole flat groups for stage 1/2,
        # empty placeholders for stage 3; counted per storage, since tied names and views share one
        copy = {
            v.storage.key: v.storage.nbytes
            for n, v in module.items()
            if n not in buffers and isinstance(v, TensorRef)
        }
        scaler = (osd0 or {}).get("loss_scaler")
        files = []
        for r, p in sorted(f.optim.items()):
            files.append(FileInfo.stat(p, "optim", r))
        if stage3:
            files += [FileInfo.stat(p, "model", r) for r, p in sorted(f.zero3_model.items())]
        elif f.model:
            files.append(FileInfo.stat(f.model, "model", None))
        ranks = []
        for r in range(ws):
            op = f.optim.get(r)
            mp = f.zero3_model.get(r) if stage3 else (f.model if r == 0 else None)
            ranks.append(
                RankInfo(
                    r,
                    op,
                    mp,
                    os.path.getsize(op) if op else 0,
                    os.path.getsize(mp) if mp else 0,
                    layout.rank_groups[r] if layout and r < len(layout.rank_groups) else (),
                )
            )
        groups: tuple[GroupInfo, ...] = layout.groups if layout else ()
        return Checkpoint(
            root=self.loc.root,
            tag=self.loc.tag,
            tags=self.loc.tags,
            tag_dir=self.loc.tag_dir,
            layout=self.loc.layout,
            stage=stage,
            world_size=ws,
            optimizer=optimizer,
            compute_dtype=compute,
            module_copy_bytes=sum(copy.values()),
            master_dtype=layout.master_dtype if layout else "float32",
            deepspeed_version=version if isinstance(version, str) else None,
            global_steps=model.get("global_steps") if isinstance(model.get("global_steps"), int) else None,
            global_samples=model.get("global_samples")
            if isinstance(model.get("global_samples"), int)
            else None,
            optimizer_step=_item(_first_step(osd0)),
            loss_scale=float(scaler.get("cur_scale"))
            if scaler is not None and hasattr(scaler, "get") and scaler.get("cur_scale") is not None
            else None,
            dynamic_loss_scale=bool((osd0 or {}).get("dynamic_loss_scale"))
            if osd0 and "dynamic_loss_scale" in osd0
            else None,
            files=tuple(files),
            ranks=tuple(ranks),
            groups=groups,
            tensors=tuple(tensors),
            findings=tuple(self.findings),
            ds_config=MappingProxyType(dict(ds_config)),
            other_runs=self.loc.other_runs,
        )


class _TooBig(Exception):
    pass


def _digest(value: Any, max_nodes: int = 100_000, max_depth: int = 64) -> str:
    """A comparable text form of metadata (config, steps, shapes), like repr() but bounded: a crafted pickle
    can nest 100k levels deep (repr -> RecursionError) or share sub-trees so repr's output is exponential."""
    out: list[str] = []
    budget = [max_nodes]

    def walk(v: Any, depth: int) -> None:
        budget[0] -= 1
        if budget[0] < 0 or depth > max_depth:
            raise _TooBig
        if isinstance(v, dict):
            out.append("{")
            for k, x in v.items():
                walk(k, depth + 1)
                out.append(":")
                walk(x, depth + 1)
                out.append(",")
            out.append("}")
        elif isinstance(v, list | tuple | set | frozenset):
            out.append(type(v).__name__ + "(")
            for x in v:
                walk(x, depth + 1)
                out.append(",")
            out.append(")")
        elif v is None or isinstance(v, str | bytes | int | float | complex):
            out.append(repr(v))
        elif isinstance(v, TensorRef):
            out.append(f"tensor({v.dtype},{v.shape})")
        else:
            out.append(type(v).__qualname__)
            walk(getattr(v, "__dict__", {}), depth + 1)

    try:
        walk(value, 0)
    except _TooBig:
        return f"<too large or deep to compare: {type(value).__name__}>"
    return "".join(out)


def _base_state(osd: dict[str, Any]) -> Any:
    return osd.get("base_optimizer_state", osd.get("optimizer_state_dict"))


def _group_steps(osd: dict[str, Any]) -> list[Any]:
    base = _base_state(osd)
    state = base.get("state") if isinstance(base, dict) else None
    if not isinstance(state, dict):
        return []
    out = []
    for s in state.values():
        step = s.get("step") if isinstance(s, dict) else None
        out.append(_item(step) if isinstance(step, TensorRef) else step)
    return out


def _first_step(osd: dict[str, Any] | None) -> Any:
    steps = _group_steps(osd) if osd else []
    return steps[0] if steps else None
