"""The `Checkpoint` record from what the scan found: identity (stage, optimizer, dtypes), files and ranks."""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from inspector.parse.dsconfig import DsConfig
from inspector.parse.states import ModelStates, OptimStates
from inspector.scan.files import RankFiles
from inspector.scan.layout import Layout
from inspector.scan.locate import Location
from inspector.scan.metadata import dtype_of, file_size, item
from inspector.scan.model import Checkpoint, FileInfo, Finding, GroupInfo, Parallel, RankInfo, TensorInfo
from inspector.system.bytesource import ByteSource


@dataclass(frozen=True)
class Loaded:
    """The records a scan parsed and what it derived from them."""

    model: ModelStates
    optims: Mapping[int, OptimStates | None]
    osd0: OptimStates | None
    layout: Layout | None
    ws: int
    stage3: bool
    # the first optimizer file's step, read while it was open (Ellipsis: not read; `item` reads it now)
    optimizer_step: Any = ...


def _stage(ds_config: DsConfig, osd0: OptimStates | None, stage3: bool) -> int:
    if stage3:
        return 3
    if ds_config.zero_stage in (1, 2):
        return ds_config.zero_stage
    if osd0 is not None and osd0.zero_stage is not None:
        return osd0.zero_stage
    return 1


def _optimizer(osd0: OptimStates | None, stage3: bool) -> str:
    if osd0 is not None and osd0.zero_stage is None and not stage3:
        return "BF16_Optimizer"
    return "DeepSpeedZeroOptimizer_Stage3" if stage3 else "DeepSpeedZeroOptimizer"


def _compute_dtype(model: ModelStates, files: RankFiles) -> str:
    if any(os.path.basename(p).startswith("bf16_") for p in files.optim.values()):
        return "bfloat16"
    buffers = set(model.buffer_names)
    return dtype_of({n: v for n, v in model.module.items() if n not in buffers}) or "float32"


def _module_copy_bytes(model: ModelStates) -> int:
    """The 16-bit weights DeepSpeed keeps beside the fp32 masters: whole flat groups for stage 1/2, empty
    placeholders for stage 3; counted per storage, since tied names and views share one."""
    buffers = set(model.buffer_names)
    copy = {v.storage.key: v.storage.nbytes for n, v in model.module.items() if n not in buffers}
    return sum(copy.values())


def _files(files: RankFiles, stage3: bool, source: ByteSource) -> list[FileInfo]:
    """Each rank file's size and save time: from the fstat of the open its load read it through
    (`RankFiles.opened`), else asked of the checkpoint's source (one stat a file)."""
    seen = files.opened.get
    out = [FileInfo.stat(p, "optim", r, source=source, known=seen(p)) for r, p in sorted(files.optim.items())]
    if stage3:
        models = sorted(files.zero3_model.items())
        out += [FileInfo.stat(p, "model", r, source=source, known=seen(p)) for r, p in models]
    elif files.model:
        out.append(FileInfo.stat(files.model, "model", None, source=source, known=seen(files.model)))
    return out


def _ranks(
    files: RankFiles, layout: Layout | None, ws: int, stage3: bool, infos: list[FileInfo]
) -> list[RankInfo]:
    sizes = {f.path: f.size for f in infos}  # stat once: `_files` asked already

    def size(path: str | None) -> int:
        return sizes[path] if path in sizes else file_size(path)

    ranks = []
    for r in range(ws):
        op = files.optim.get(r)
        mp = files.zero3_model.get(r) if stage3 else (files.model if r == 0 else None)
        groups = layout.rank_groups[r] if layout and r < len(layout.rank_groups) else ()
        ranks.append(RankInfo(r, op, mp, size(op), size(mp), groups))
    return ranks


def checkpoint(
    loc: Location, files: RankFiles, got: Loaded, tensors: list[TensorInfo], findings: list[Finding]
) -> Checkpoint:
    """Assemble the scan's result."""
    model, osd0, layout = got.model, got.osd0, got.layout
    step = osd0.steps[0] if osd0 and osd0.steps else None
    return record(
        loc,
        model,
        stage=_stage(model.ds_config, osd0, got.stage3),
        world_size=got.ws,
        optimizer=_optimizer(osd0, got.stage3),
        compute_dtype=_compute_dtype(model, files),
        master_dtype=layout.master_dtype if layout else "float32",
        optimizer_step=item(step) if got.optimizer_step is ... else got.optimizer_step,
        loss_scale=osd0.loss_scale if osd0 else None,
        dynamic_loss_scale=osd0.dynamic_loss_scale if osd0 else None,
        files=(infos := _files(files, got.stage3, loc.source)),
        ranks=_ranks(files, layout, got.ws, got.stage3, infos),
        groups=layout.groups if layout else (),
        tensors=tensors,
        findings=findings,
        module_copy_bytes=_module_copy_bytes(model),
    )


@dataclass(frozen=True)
class Folder:
    """A folder that is its own one tag (a universal checkpoint), where `record` otherwise takes a `Location`."""

    root: str
    tag: str
    tag_dir: str
    layout: str
    other_runs: tuple[str, ...] = ()

    @property
    def tags(self) -> tuple[str, ...]:
        return (self.tag,)


def record(
    loc: Location | Folder,
    model: ModelStates,
    *,
    stage: int,
    world_size: int,
    optimizer: str,
    compute_dtype: str,
    master_dtype: str,
    optimizer_step: int | None,
    loss_scale: float | None,
    dynamic_loss_scale: bool | None,
    files: Iterable[FileInfo],
    ranks: Iterable[RankInfo],
    groups: Iterable[GroupInfo],
    tensors: Iterable[TensorInfo],
    findings: Iterable[Finding],
    module_copy_bytes: int = 0,
    parallel: Parallel | None = None,
) -> Checkpoint:
    """The one place every scanner (ZeRO, pipeline, ZeRO-off MoE, universal) builds its `Checkpoint`: where
    the tag is and what the first model-states record says are filled the same way for all of them."""
    return Checkpoint(
        root=loc.root,
        tag=loc.tag,
        tags=loc.tags,
        tag_dir=loc.tag_dir,
        layout=loc.layout,
        stage=stage,
        world_size=world_size,
        optimizer=optimizer,
        compute_dtype=compute_dtype,
        master_dtype=master_dtype,
        deepspeed_version=model.ds_version,
        global_steps=model.global_steps,
        global_samples=model.global_samples,
        optimizer_step=optimizer_step,
        loss_scale=loss_scale,
        dynamic_loss_scale=dynamic_loss_scale,
        files=tuple(files),
        ranks=tuple(ranks),
        groups=tuple(groups),
        tensors=tuple(tensors),
        findings=tuple(findings),
        ds_config=model.ds_config,
        other_runs=loc.other_runs,
        module_copy_bytes=module_copy_bytes,
        parallel=parallel,
    )
