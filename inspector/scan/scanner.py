"""Scan a DeepSpeed ZeRO checkpoint into a `Checkpoint`: metadata only, no tensor data.

Stage 1/2 flat groups partitioned by rank (rebuilt from `param_shapes`, never from `param_slice_mappings`),
stage 3 per-parameter partitions, frozen parameters, tied aliases and buffers. The steps live in their own
modules: locate (which tag), files (which rank files, loaded), layout (where each parameter's bytes are),
tensors (the tensor list), assemble (the record); this one runs them in order and collects findings.
"""

from __future__ import annotations

from typing import Any

from inspector.errors import InspectorError, NotACheckpointError, UnsupportedCheckpointError
from inspector.scan.assemble import Loaded, checkpoint
from inspector.scan.files import RankFiles, classify, load_checked, load_or_finding, missing_ranks
from inspector.scan.layout import Layout, stage3_layout, stage12_layout
from inspector.scan.locate import Location, locate
from inspector.scan.metadata import digest, group_steps
from inspector.scan.model import Checkpoint, Finding, Severity
from inspector.scan.tensors import TensorCollector


def scan(path: str, tag: str | None = None) -> Checkpoint:
    """Scan `path` (root, tag folder, Trainer run, Lightning .ckpt or universal checkpoint) into a `Checkpoint`."""
    from inspector.scan.universal import find_universal, scan_universal

    if (uni := find_universal(path, tag)) is not None:
        return scan_universal(uni)
    loc = locate(path, tag)
    files = classify(loc.tag_dir)
    return _Scanner(loc, files).build()


class _Scanner:
    def __init__(self, loc: Location, files: RankFiles) -> None:
        self.loc = loc
        self.files = files
        self.findings: list[Finding] = list(loc.findings) + files.findings

    def add(
        self, severity: Severity, code: str, message: str, file: str | None = None, hint: str = ""
    ) -> None:
        self.findings.append(Finding(severity, code, message, file, hint))

    def build(self) -> Checkpoint:
        f = self.files
        stage3 = bool(f.zero3_model)
        model_path, model = self._model(stage3)
        ws = max(f.optim) + 1
        dp_ws = model.get("dp_world_size")
        if isinstance(dp_ws, int) and dp_ws > ws:
            ws = dp_ws
        self.findings += missing_ranks(f.optim, ws, "optimizer", self.loc.tag_dir)
        if stage3:
            self.findings += missing_ranks(f.zero3_model, ws, "model-states", self.loc.tag_dir)
        root = self.loc.root
        optims = {r: load_or_finding(p, root, self.findings) for r, p in sorted(f.optim.items())}
        models = {0: model}
        if stage3:
            rest = sorted(f.zero3_model.items())
            models.update({r: load_or_finding(p, root, self.findings) for r, p in rest if r != 0})
        osd0 = self._optimizer_state(optims)
        self._check_consistency(model, models, optims, model.get("ds_version"))
        layout = self._layout(model, model_path, models, optims, osd0, ws, stage3)
        tensors = TensorCollector(f, self.add).collect(model, models, layout, ws, stage3)
        got = Loaded(model, optims, osd0, layout, ws, stage3)
        return checkpoint(self.loc, f, got, tensors, self.findings)

    def _model(self, stage3: bool) -> tuple[str, dict[str, Any]]:
        """The rank-0 model states: essential, so every problem with them is an error, not a finding."""
        f = self.files
        tag_dir = self.loc.tag_dir
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
        model = load_checked(model_path, self.loc.root)
        if not isinstance(model, dict) or "module" not in model:
            raise NotACheckpointError(f"{model_path} is not a DeepSpeed model-states file (no 'module' key).")
        if model.get("module") is None:
            raise UnsupportedCheckpointError(
                f"{model_path} has no module weights (pipeline-parallel run).",
                hint="Pipeline-parallel checkpoints are not supported yet.",
            )
        return model_path, model

    def _layout(
        self,
        model: dict[str, Any],
        model_path: str,
        models: dict[int, Any],
        optims: dict[int, Any],
        osd0: dict[str, Any] | None,
        ws: int,
        stage3: bool,
    ) -> Layout | None:
        """Where every trainable parameter lives, if the rank files allow it; otherwise a finding says why."""
        f = self.files
        tag_dir = self.loc.tag_dir
        complete = all(optims.get(r) is not None for r in range(ws)) and (
            not stage3 or all(models.get(r) is not None for r in range(ws))
        )
        param_shapes = model.get("param_shapes") or (osd0 or {}).get("param_shapes")
        layout: Layout | None = None
        if osd0 is not None and complete and param_shapes:
            osds = [optims[r]["optimizer_state_dict"] for r in range(ws)]
            build = stage3_layout if stage3 else stage12_layout
            try:
                layout = build(param_shapes, osds, [f.optim[r] for r in range(ws)])
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
        return layout

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
            return (tree.get("ds_version"), digest(tree.get("ds_config")), digest(group_steps(osd)))

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
        model_sig = (model.get("ds_version"), digest(model.get("ds_config")))
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
        shapes = {r: digest(m.get("param_shapes")) for r, m in models.items() if isinstance(m, dict)}
        if len(set(steps.values())) > 1 or len(set(shapes.values())) > 1:
            self.add(
                Severity.ERROR,
                "mixed-runs",
                "Stage-3 model files disagree on global_steps or parameter shapes "
                f"({ {r: v if isinstance(v, int) else type(v).__name__ for r, v in steps.items()} }).",
                self.loc.tag_dir,
                "Restore the tag folder from one save.",
            )
