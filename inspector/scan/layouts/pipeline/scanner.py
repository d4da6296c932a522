"""Pipeline-parallel checkpoints (`deepspeed.pipe.PipelineModule`, FORMAT.md §1.2, §3.6).

The tag folder holds one `layer_XX-model_states.pt` per layer with parameters (global layer index, keys
without the layer prefix), one `mp_rank_SS_model_states.pt` per stage with `module` None, and per stage the
optimizer state: `*_optim_states.pt` per data-parallel rank (ZeRO-1, or BF16_Optimizer with ZeRO off) whose
flat groups are rebuilt exactly as a data-parallel run's (`layout.stage12_layout`), named as the pipeline
module names them (`2.weight`, `tied_modules.embed.weight`). A tied module lives on every stage that uses it:
the output holds one copy (the first stage's) and the other stages' copies are checked equal to it. With ZeRO
off in fp16 the stage file itself holds unnamed per-parameter masters, named by proof (`pipeline_zero0`).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from inspector.errors import InspectorError, UnsupportedCheckpointError
from inspector.parse.layers import ParallelDims, TensorFile
from inspector.parse.states import ModelStates, OptimStates
from inspector.parse.zero_off import UnfusedFp16
from inspector.scan.assemble import record
from inspector.scan.files import load_or_finding
from inspector.scan.holding import TIED_PREFIX, Holding
from inspector.scan.layout import stage12_layout
from inspector.scan.layouts.base import tree_at
from inspector.scan.layouts.pipeline.files import Stage, classify, is_pipeline, missing_layers
from inspector.scan.layouts.pipeline.names import (
    LAYER_NAME,
    lost_tied_files,
    order_key,
    plain,
    shapes_from_slices,
    tied_layer_files,
    with_copy,
)
from inspector.scan.layouts.pipeline.zero0 import StageMasters
from inspector.scan.locate import Location
from inspector.scan.metadata import file_size, item
from inspector.scan.model import (
    Checkpoint,
    FileInfo,
    Finding,
    GroupInfo,
    Kind,
    Parallel,
    RankInfo,
    Severity,
    TensorInfo,
)
from inspector.scan.parallel_checks import CopyChecks
from inspector.system.bytesource import ByteSource


def scan_pipeline(loc: Location) -> Checkpoint:
    """Scan a pipeline-parallel tag folder into a `Checkpoint` whose tensors carry pipeline names."""
    return Pipeline(loc).build()


class Pipeline:
    """One tensor-parallel rank's pipeline (all of it when tp is 1): its stages rebuilt and merged."""

    def __init__(
        self, loc: Location, tp_rank: int = 0, tp: int = 1, only: frozenset[str] | None = None, trees: Any = None
    ) -> None:
        self.loc = loc
        self.trees = {} if trees is None else trees  # trees this scan loaded (`Found.trees`): each file once
        self.only = only  # the names the claim pass gave the pipeline (scan/claims.py); None: all
        self.source: ByteSource = loc.source
        self.findings: list[Finding] = list(loc.findings)
        self.tp_rank, self.tp = tp_rank, tp
        self.layers: dict[int, str] = {}
        self.stages: dict[int, Stage] = {}
        self.masters: StageMasters | None = None  # ZeRO-off fp16 stages' masters, named stage by stage

    def add(
        self, severity: Severity, code: str, message: str, file: str | None = None, hint: str = ""
    ) -> None:
        self.findings.append(Finding(severity, code, message, file, hint))

    def _classify(self) -> int:
        self.files = classify(self.loc, self.tp_rank, self.tp, self.only)
        self.layers, self.stages = self.files.layers, self.files.stages
        self.findings += self.files.findings
        return self.files.present

    # -- per stage -------------------------------------------------------------------------------------------

    def _load_stage(self, st: Stage) -> tuple[ParallelDims | None, UnfusedFp16 | None]:
        try:
            tree = tree_at(self.trees, st.model_file, self.source)
            st.model = ModelStates.parse(tree, st.model_file)
            return ParallelDims.parse(tree, st.model_file), UnfusedFp16.parse(tree, st.model_file)
        except InspectorError as exc:
            if st.index == 0:
                raise
            self.add(Severity.ERROR, "unreadable", exc.message, st.model_file, exc.hint)
            return None, None

    def _no_optimizer_files(
        self, st: Stage, unfused: UnfusedFp16 | None, layer_files: Mapping[int, TensorFile]
    ) -> None:
        """A stage without optimizer files: ZeRO off (the optimizer state in the stage file), or files lost."""
        cfg = st.model.ds_config if st.model else None
        if unfused is None and cfg is not None and cfg.zero_stage == 0 and not cfg.bf16:
            raise UnsupportedCheckpointError(  # (bf16 at stage 0 writes optimizer files: their loss is damage)
                f"{st.model_file}: pipeline stage {st.index} was saved with ZeRO off (its ds_config says "
                "stage 0), so its optimizer state is in this file, but in a form not supported yet (not "
                "FP16_Optimizer's, FP16_UnfusedOptimizer's or a torch optimizer's).",
                hint="Nothing is missing: ZeRO off writes no optimizer files.",
            )
        if unfused is None:
            self.add(
                Severity.ERROR,
                "missing-rank",
                f"Stage {st.index} has no optimizer files.",
                st.model_file,
                "Copy the complete checkpoint folder; every data-parallel rank of every stage writes one.",
            )
            return
        st.optimizer = (
            "torch optimizer"
            if unfused.plain
            else "FP16_Optimizer"
            if unfused.fused
            else "FP16_UnfusedOptimizer"
        )
        st.zero_stage, st.loss_scale = 0, unfused.loss_scale
        if self.masters is None:  # masters (fp32: the weights; fused: cut from a flat block) named in order
            buffers = {n for s in self.stages.values() if s.model for n in s.model.buffer_names}
            self.masters = StageMasters(layer_files, buffers, self.source)
        st.layout = self.masters.stage(st.index, unfused)

    def _stage_layout(
        self, st: Stage, dp: int, unfused: UnfusedFp16 | None, layer_files: Mapping[int, TensorFile]
    ) -> None:
        """Stage `st`'s flat optimizer groups rebuilt into its parameters (`st.layout`), or a finding."""
        model = st.model
        if model is None:
            return
        if not st.optims:
            self._no_optimizer_files(st, unfused, layer_files)
            return
        missing = [d for d in range(dp) if d not in st.optims]
        for d in missing[:8]:
            self.add(
                Severity.ERROR,
                "missing-rank",
                f"The optimizer file of stage {st.index}, data-parallel rank {d}, is missing.",
                self.loc.tag_dir,
                "Copy the complete checkpoint folder.",
            )
        loaded = {
            d: load_or_finding(p, self.source, self.findings, lambda t, p: OptimStates.parse(t, p, False))
            for d, p in sorted(st.optims.items())
        }
        if missing or any(v is None for v in loaded.values()):
            return
        st.states = [v for _, v in sorted(loaded.items()) if v is not None]
        if st.states[0].zero_stage is None:
            st.optimizer, st.zero_stage = "BF16_Optimizer", 0 if not model.param_shapes else 1
        shapes = model.param_shapes or shapes_from_slices(st.states, layer_files)
        if not shapes:
            self.add(
                Severity.ERROR,
                "no-param-shapes",
                f"Stage {st.index}: neither param_shapes nor the "
                "optimizer's fragment maps name the parameters.",
                st.model_file,
            )
            return
        try:
            st.layout = stage12_layout(shapes, st.states)
        except InspectorError as exc:
            self.add(Severity.ERROR, "layout", exc.message, st.model_file, exc.hint)
            return
        self.findings += st.layout.findings

    # -- the whole ---------------------------------------------------------------------------------------------

    def build(self) -> Checkpoint:
        present = self._classify()
        dims: dict[int, ParallelDims | None] = {}
        unfused: dict[int, UnfusedFp16 | None] = {}
        for s, st in sorted(self.stages.items()):
            dims[s], unfused[s] = self._load_stage(st)
        d0 = dims[0]
        model0 = self.stages[0].model
        assert model0 is not None and d0 is not None
        if (d0.tp_degree or self.tp) != self.tp:  # older saves record no degree: the layer files say it
            raise UnsupportedCheckpointError(
                f"{self.loc.tag_dir}: the model states say tp_degree {d0.tp_degree or 1}, but the layer files "
                f"name {self.tp} tensor-parallel rank(s).",
                hint="Files of different runs are mixed, or tensor-parallel layer files are missing.",
            )
        pp = d0.pp_degree or (d0.mp_world_size or 0) // self.tp or len(self.stages)
        if pp > present:
            self.add(
                Severity.ERROR,
                "world-size",
                f"The model states say the pipeline has {pp:,} stages, but the "
                f"tag folder holds only {present} files.",
                model0.file,
            )
            pp = len(self.stages)
        for s in range(pp):
            if s not in self.stages:
                self.add(
                    Severity.ERROR,
                    "missing-stage",
                    f"The model file of pipeline stage {s} (mp_rank_{s * self.tp + self.tp_rank:02d}_model_"
                    "states.pt) is missing.",
                    self.loc.tag_dir,
                    "Copy the complete checkpoint folder; every stage writes its own file.",
                )
        dp = model0.dp_world_size or max(len(st.optims) for st in self.stages.values()) or 1
        layer_files = {
            i: f
            for i, p in sorted(self.layers.items())
            if (f := load_or_finding(p, self.source, self.findings, TensorFile.parse)) is not None
        }
        for s, st in sorted(self.stages.items()):
            self._stage_layout(st, dp, unfused.get(s), layer_files)
        if self.masters is not None:
            self.findings += self.masters.finish(self.stages, self.stages[0].model_file)
        self.findings += missing_layers(self.files, self.loc.tag_dir, self.tp_rank)
        tensors, groups, ranks = self._merge(layer_files, dp)
        return self._checkpoint(tensors, groups, ranks, pp, dp, layer_files)

    def _merge(
        self, layer_files: Mapping[int, TensorFile], dp: int
    ) -> tuple[list[TensorInfo], list[GroupInfo], list[RankInfo]]:
        """Every stage's tensors under one name space: groups numbered across stages, one copy of each tied
        weight (the others checked equal), buffers and frozen parameters from the layer files."""
        trainable: dict[str, TensorInfo] = {}
        copies: dict[str, list[tuple[int, TensorInfo]]] = {}
        groups: list[GroupInfo] = []
        ranks: list[RankInfo] = []
        buffers: set[str] = set()
        for s, st in sorted(self.stages.items()):
            if st.model is not None:
                buffers.update(st.model.buffer_names)
            base = len(groups)
            lay = st.layout
            if lay is not None:
                groups += [replace(g, index=base + g.index) for g in lay.groups]
                for name, t in lay.params.items():
                    t = replace(t, group=base + (t.group or 0))
                    if name in trainable:
                        copies.setdefault(name, []).append((s, t))
                    else:
                        trainable[name] = t
            for d, path in sorted(st.held().items()):
                rgs = lay.rank_groups[d] if lay is not None and d < len(lay.rank_groups) else ()
                rgs = tuple(replace(g, group=base + g.group) for g in rgs)
                ranks.append(
                    RankInfo(
                        s * dp + d,
                        path,
                        st.model_file if d == 0 else None,
                        file_size(path),
                        file_size(st.model_file) if d == 0 else 0,
                        rgs,
                    )
                )
        with CopyChecks(self.source) as checks:  # each file opened once for every tied weight's copies
            differ = [(n, s) for n, others in copies.items() for s, t in others if checks.differ(trainable[n], t)]
        for name, s in differ:
            self.add(
                Severity.ERROR,
                "tied-differ",
                f"The tied weight {name} differs between stage "
                f"{_stage_of(trainable[name], self.stages)} and stage {s}: DeepSpeed keeps every "
                "stage's copy equal, so one of the files is damaged or from another save.",
                self.loc.tag_dir,
                "Restore the tag folder from one save.",
            )
        return self._with_layer_files(trainable, buffers, layer_files), groups, ranks

    def _with_layer_files(
        self, trainable: Mapping[str, TensorInfo], buffers: set[str], layer_files: Mapping[int, TensorFile]
    ) -> list[TensorInfo]:
        """The layer files' part: each trainable tensor's 16-bit copy (a tied module's from its own layer file),
        buffers, and frozen parameters (only with every stage present); in the pipeline module's order."""
        out = dict(trainable)
        complete = not any(f.severity is Severity.ERROR for f in self.findings)
        tied_files = tied_layer_files(trainable, layer_files)
        for idx, lf in sorted(layer_files.items()):
            for key, ref in lf.tensors.items():
                name = f"{idx}.{key}"
                if idx in tied_files:
                    owner = f"{tied_files[idx]}.{key}"
                    if owner in out:
                        out[owner] = with_copy(out[owner], ref)
                elif name in out:
                    out[name] = with_copy(out[name], ref)
                elif name in buffers:
                    out[name] = plain(name, ref, Kind.BUFFER)
                elif complete:  # with a stage missing, its parameters would look frozen here
                    out[name] = plain(name, ref, Kind.FROZEN)
        missing = sorted(n for n in buffers if n not in out)
        if missing:
            self.add(
                Severity.WARNING,
                "missing-buffer",
                f"{len(missing)} buffer(s) listed by the stages are in no layer file (e.g. {missing[0]}).",
                self.loc.tag_dir,
            )
        self.findings += lost_tied_files(trainable, tied_files, self.loc.tag_dir)
        in_file = {f"{idx}.{key}": i for idx, lf in layer_files.items() for i, key in enumerate(lf.tensors)}
        return sorted(out.values(), key=lambda t: (*order_key(t.name), in_file.get(t.name, 0)))

    def _checkpoint(
        self,
        tensors: list[TensorInfo],
        groups: list[GroupInfo],
        ranks: list[RankInfo],
        pp: int,
        dp: int,
        layer_files: Mapping[int, TensorFile],
    ) -> Checkpoint:
        st0 = self.stages[0]
        model0 = st0.model
        assert model0 is not None
        files = self._file_infos()
        osd0 = st0.states[0] if st0.states else None
        step = osd0.steps[0] if osd0 and osd0.steps else None
        copies = [t.module_copy[0].dtype for t in tensors if t.kind is Kind.TRAINABLE and t.module_copy]
        compute = (
            "bfloat16"
            if any(
                os.path.basename(p).startswith("bf16_")
                for st in self.stages.values()
                for p in st.optims.values()
            )
            else (copies[0] if copies else "float32")
        )
        master = next((st.layout.master_dtype for st in self.stages.values() if st.layout), "float32")
        parallel = Parallel("pipeline", pp=pp, dp=dp, placement=self._placement(dp))
        return record(
            self.loc,
            model0,
            stage=st0.zero_stage,
            world_size=pp * dp,
            optimizer=st0.optimizer,
            compute_dtype=compute,
            master_dtype=master,
            optimizer_step=item(step),
            loss_scale=osd0.loss_scale if osd0 else st0.loss_scale,
            dynamic_loss_scale=osd0.dynamic_loss_scale if osd0 else None,
            files=files,
            ranks=ranks,
            groups=groups,
            tensors=tensors,
            findings=self.findings,
            module_copy_bytes=(  # ZeRO off in fp32: the layer files' weights are the masters, not copies
                0
                if st0.optimizer == "torch optimizer"
                else sum(ref.nbytes for lf in layer_files.values() for ref in lf.tensors.values())
            ),
            parallel=parallel,
        )

    def _file_infos(self) -> list[FileInfo]:
        """Optimizer, stage and layer files, each with its model-parallel rank (stage x tp + tp rank)."""
        mp = {s: s * self.tp + self.tp_rank for s in self.stages}
        files = [
            FileInfo.stat(p, "optim", d, mp[s])
            for s, st in sorted(self.stages.items())
            for d, p in sorted(st.optims.items())
        ]
        files += [FileInfo.stat(st.model_file, "model", None, mp[s]) for s, st in sorted(self.stages.items())]
        return files + [FileInfo.stat(p, "layer", None, self.tp_rank) for _, p in sorted(self.layers.items())]

    def _placement(self, dp: int) -> tuple[Holding, ...]:
        """Per stage: the parameter layers and tied modules whose masters its optimizer files hold, and its
        global ranks ((stage x dp + data-parallel rank) x tp + tensor-parallel rank)."""
        rows = []
        for s, st in sorted(self.stages.items()):
            params = st.layout.params if st.layout else {}
            layers = sorted({int(m.group(1)) for n in params if (m := LAYER_NAME.match(n))})
            tied = sorted({n.split(".")[1] for n in params if n.startswith(TIED_PREFIX)})
            held = sorted(st.optims) or (range(dp) if st.held() else [])  # ZeRO off: every replica holds it
            ranks = tuple((s * dp + d) * self.tp + self.tp_rank for d in held)
            rows.append(Holding(stage=s, layers=tuple(layers), tied=tuple(tied), ranks=ranks))
        return tuple(rows)


def _stage_of(t: TensorInfo, stages: Mapping[int, Stage]) -> int:
    for s, st in sorted(stages.items()):
        if st.layout is not None and st.layout.params.get(t.name) is not None:
            return s
    return 0


__all__ = ["is_pipeline", "scan_pipeline"]
