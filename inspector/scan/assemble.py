"""The `Checkpoint` record from what the scan found: identity (stage, optimizer, dtypes), files and ranks."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from inspector.format.torchzip import TensorRef
from inspector.scan.files import RankFiles
from inspector.scan.layout import Layout
from inspector.scan.locate import Location
from inspector.scan.metadata import dtype_of, file_size, first_step, item
from inspector.scan.model import Checkpoint, FileInfo, Finding, GroupInfo, RankInfo, TensorInfo


@dataclass(frozen=True)
class Loaded:
    """The trees a scan loaded and what it derived from them."""

    model: dict[str, Any]
    optims: dict[int, Any]
    osd0: dict[str, Any] | None
    layout: Layout | None
    ws: int
    stage3: bool


def _stage(ds_config: dict[str, Any], osd0: dict[str, Any] | None, stage3: bool) -> int:
    zero = ds_config.get("zero_optimization")
    cfg_stage = zero.get("stage") if isinstance(zero, dict) else None
    zstage = (osd0 or {}).get("zero_stage")
    if stage3:
        return 3
    if isinstance(cfg_stage, int) and cfg_stage in (1, 2):
        return cfg_stage
    if isinstance(zstage, int):
        return int(zstage)
    return 1


def _optimizer(osd0: dict[str, Any] | None, stage3: bool) -> str:
    if osd0 is not None and "zero_stage" not in osd0 and not stage3:
        return "BF16_Optimizer"
    return "DeepSpeedZeroOptimizer_Stage3" if stage3 else "DeepSpeedZeroOptimizer"


def _compute_dtype(model: dict[str, Any], files: RankFiles) -> str:
    if any(os.path.basename(p).startswith("bf16_") for p in files.optim.values()):
        return "bfloat16"
    module = model.get("module") or {}
    buffers = model.get("buffer_names") or []
    return dtype_of({n: v for n, v in module.items() if n not in buffers}) or "float32"


def _module_copy_bytes(model: dict[str, Any]) -> int:
    """The 16-bit weights DeepSpeed keeps beside the fp32 masters: whole flat groups for stage 1/2, empty
    placeholders for stage 3; counted per storage, since tied names and views share one."""
    buffers = set(model.get("buffer_names") or [])
    module = model.get("module") or {}
    copy = {
        v.storage.key: v.storage.nbytes
        for n, v in module.items()
        if n not in buffers and isinstance(v, TensorRef)
    }
    return sum(copy.values())


def _loss_scale(osd0: dict[str, Any] | None) -> float | None:
    scaler = (osd0 or {}).get("loss_scaler")
    value = scaler.get("cur_scale") if scaler is not None and hasattr(scaler, "get") else None
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None  # absent, or something a crafted pickle put there
    return float(value) if math.isfinite(value) else None


def _files(files: RankFiles, stage3: bool) -> list[FileInfo]:
    out = [FileInfo.stat(p, "optim", r) for r, p in sorted(files.optim.items())]
    if stage3:
        out += [FileInfo.stat(p, "model", r) for r, p in sorted(files.zero3_model.items())]
    elif files.model:
        out.append(FileInfo.stat(files.model, "model", None))
    return out


def _ranks(files: RankFiles, layout: Layout | None, ws: int, stage3: bool) -> list[RankInfo]:
    ranks = []
    for r in range(ws):
        op = files.optim.get(r)
        mp = files.zero3_model.get(r) if stage3 else (files.model if r == 0 else None)
        groups = layout.rank_groups[r] if layout and r < len(layout.rank_groups) else ()
        ranks.append(RankInfo(r, op, mp, file_size(op), file_size(mp), groups))
    return ranks


def _int_or_none(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def checkpoint(
    loc: Location, files: RankFiles, got: Loaded, tensors: list[TensorInfo], findings: list[Finding]
) -> Checkpoint:
    """Assemble the scan's result."""
    model, osd0, layout = got.model, got.osd0, got.layout
    raw_config = model.get("ds_config")
    ds_config: dict[str, Any] = raw_config if isinstance(raw_config, dict) else {}
    version = model.get("ds_version")
    groups: tuple[GroupInfo, ...] = layout.groups if layout else ()
    return Checkpoint(
        root=loc.root,
        tag=loc.tag,
        tags=loc.tags,
        tag_dir=loc.tag_dir,
        layout=loc.layout,
        stage=_stage(ds_config, osd0, got.stage3),
        world_size=got.ws,
        optimizer=_optimizer(osd0, got.stage3),
        compute_dtype=_compute_dtype(model, files),
        module_copy_bytes=_module_copy_bytes(model),
        master_dtype=layout.master_dtype if layout else "float32",
        deepspeed_version=version if isinstance(version, str) else None,
        global_steps=_int_or_none(model.get("global_steps")),
        global_samples=_int_or_none(model.get("global_samples")),
        optimizer_step=item(first_step(osd0)),
        loss_scale=_loss_scale(osd0),
        dynamic_loss_scale=bool(osd0.get("dynamic_loss_scale"))
        if osd0 and "dynamic_loss_scale" in osd0
        else None,
        files=tuple(_files(files, got.stage3)),
        ranks=tuple(_ranks(files, layout, got.ws, got.stage3)),
        groups=groups,
        tensors=tuple(tensors),
        findings=tuple(findings),
        ds_config=MappingProxyType(dict(ds_config)),
        other_runs=loc.other_runs,
    )
