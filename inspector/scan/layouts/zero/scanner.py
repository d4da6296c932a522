"""The data-parallel ZeRO scan: stage 1/2 flat groups partitioned by rank (rebuilt from `param_shapes`, never
from `param_slice_mappings`), stage 3 per-parameter partitions, frozen parameters, tied aliases and buffers.
Apart from `scanner`, which only decides which layout a tag holds, so the layout modules that build on this one
(`moe`, `tensor`) import it without importing the dispatch that imports them.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from inspector.errors import InspectorError, NotACheckpointError, UnsupportedCheckpointError
from inspector.format.container import Container
from inspector.parse.states import ModelStates, OptimStates
from inspector.scan.assemble import Loaded, checkpoint
from inspector.scan.claims import Role, bounded, claim, damaging, model_role, optim_role, zero3_model_role
from inspector.scan.files import RankFiles, load_all, missing_ranks
from inspector.scan.layout import Layout, ParamShapes, stage3_layout, stage12_layout
from inspector.scan.layouts.base import tree_at
from inspector.scan.layouts.zero.slim import Slim
from inspector.scan.locate import Location
from inspector.scan.metadata import (
    PaddingRead,
    copied_ranks,
    padding_spots,
    rank_probe,
    read_padding,
    read_steps,
    stage3_rank_proof,
    steps_key,
)
from inspector.scan.model import Checkpoint, Finding, Severity
from inspector.scan.tensors import TensorCollector


@dataclass(frozen=True)
class Read:
    """What a ZeRO scan has read when it lays the flat groups out: the `_layout` hook's one argument."""

    model: ModelStates  # rank 0's model states
    models: dict[int, ModelStates | None]  # every rank's (stage 3), rank 0's alone otherwise
    optims: dict[int, OptimStates | None]
    osd0: OptimStates | None  # the first optimizer states that parsed
    ws: int
    stage3: bool
    param_shapes: ParamShapes | None

    @property
    def complete(self) -> bool:
        """Every rank's optimizer states parsed, and under stage 3 its model states too."""
        return all(
            self.optims.get(r) is not None and (not self.stage3 or self.models.get(r) is not None)
            for r in range(self.ws)
        )

    def states(self) -> list[OptimStates]:
        """The ranks' optimizer states that parsed, in rank order."""
        return [o for r in range(self.ws) if (o := self.optims.get(r)) is not None]


class ZeroScanner:
    """One data-parallel ZeRO world (stage 0-3): the rank files of one tag become a `Checkpoint`. The model-
    parallel layouts scan each of their worlds with it, or extend it (`moe`)."""

    def __init__(self, loc: Location, files: RankFiles, trees: dict[str, Any] | None = None) -> None:
        self.loc = loc
        self.files = files
        self.trees = trees if trees is not None else {}  # rank-0 model-states trees by path (`Found.trees`)
        self.findings: list[Finding] = list(loc.findings) + files.findings
        self._steps: dict[str, str] = {}  # each optimizer file's step counters, read as it was loaded
        self._first_steps: dict[str, int | None] = {}  # each optimizer file's first step, read as loaded
        self._probes: dict[str, bytes] = {}  # each optimizer file's `rank_probe`, taken as it was loaded
        self._slim = Slim()  # what the ranks' records share, so memory stays flat in the rank count
        self._last: tuple[str, int, ParamShapes] | None = None  # stage 3: the last rank's file, ws, shapes
        self._padding: PaddingRead | None = None  # the rank proof's padding, read as that file was loaded

    def add(
        self, severity: Severity, code: str, message: str, file: str | None = None, hint: str = ""
    ) -> None:
        self.findings.append(Finding(severity, code, message, file, hint))

    def build(self) -> Checkpoint:
        f = self.files
        stage3 = bool(f.zero3_model)
        model = self._model(stage3)
        if not self.shard:  # a tensor-parallel shard's files are claimed by scan/tensor.py, for every shard
            self._claim(model, stage3)
        ws = max(f.optim) + 1
        if model.dp_world_size is not None and model.dp_world_size > ws:
            if model.dp_world_size > f.present:  # a world size the folder cannot hold: say so once
                self.add(
                    Severity.ERROR,
                    "world-size",
                    f"The model states say dp_world_size={model.dp_world_size:,}, but the tag folder holds "
                    f"only {f.present} files.",
                    model.file,
                    "Rank files are missing, or the model-states file is damaged or crafted.",
                )
            else:
                ws = model.dp_world_size
        self.findings += missing_ranks(f.optim, ws, "optimizer", self.loc.tag_dir)
        if stage3:
            self.findings += missing_ranks(f.zero3_model, ws, "model-states", self.loc.tag_dir)
        source = self.loc.source
        if stage3 and (last := f.optim.get(ws - 1)) is not None and model.param_shapes:
            self._last = (last, ws, model.param_shapes)
        optims: dict[int, OptimStates | None] = load_all(
            sorted(f.optim.items()),
            source,
            self.findings,
            lambda t, p: self._slim.optim(self._optim_states(t, p, stage3), model),
            self._read_steps,
            opened=f.opened,
        )
        models: dict[int, ModelStates | None] = {0: model}
        if stage3:
            rest = [(r, p) for r, p in sorted(f.zero3_model.items()) if r != 0]
            models.update(
                load_all(
                    rest,
                    source,
                    self.findings,
                    lambda t, p: self._slim.model(self._model_states(t, p, False), model),
                    skip=_MODULE,  # parsed without it: its placeholders are not even made
                    opened=f.opened,
                )
            )
        osd0 = next((o for o in optims.values() if o is not None), None)
        self._check_consistency(model, models, optims)
        param_shapes = model.param_shapes or (osd0.param_shapes if osd0 else None)
        layout = self._layout(Read(model, models, optims, osd0, ws, stage3, param_shapes))
        if layout is not None and param_shapes and not self.findings_have_errors():
            states = [o for o in optims.values() if o is not None]
            self.findings += copied_ranks(states, self.loc.source, self._probes)
            if stage3 and not self.findings_have_errors():
                self.findings += self._stage3_proof(param_shapes, states)
        tensors = TensorCollector(f, self.add).collect(model, models, layout, ws, stage3, param_shapes)
        got = Loaded(model, optims, osd0, layout, ws, stage3, self._first_steps.get(osd0.file, ...) if osd0 else ...)
        return checkpoint(self.loc, f, got, tensors, self.findings)

    def _read_steps(self, o: OptimStates, archive: Container) -> None:
        """A rank file's step counters and copy probe, and on the last stage-3 rank the rank proof's padding,
        read while it is open for its pickle (`_check_consistency`, `copied_ranks` and `_stage3_proof` use
        them: no file is opened again); a step read that fails is left to that check, which reads again and
        reports it."""
        with contextlib.suppress(OSError, InspectorError):
            self._steps[o.file], first = read_steps(o.steps, archive)
            if o.steps:
                self._first_steps[o.file] = first  # the optimizer step shown
        self._probes[o.file] = rank_probe(o, archive)
        if self._last is not None and o.file == self._last[0]:
            _, ws, shapes = self._last
            shapes = self._proof_shapes(shapes, o)
            spots = padding_spots(shapes, o, ws)
            self._padding = PaddingRead(o.file, shapes, read_padding(spots, archive) if spots else None)

    def _proof_shapes(self, param_shapes: ParamShapes, last: OptimStates) -> ParamShapes:
        """The groups the rank proof reads, as the last rank's file alone tells them (`_stage3_proof` reads
        again only when the scan's full reading names others)."""
        return param_shapes

    def _claim(self, model: ModelStates, stage3: bool) -> None:
        """Every file of the tag folder claimed by one role (scan/claims.py); the rank files are those claimed,
        so a stray or duplicate file is a finding and never read."""
        f = self.files
        dp = bounded(model.dp_world_size, f.present)
        optim = optim_role(dp, 1)
        states = zero3_model_role(dp, 1) if stage3 else model_role(1)
        experts = self._expert_role(model, stage3)
        claims = claim(
            self.loc.tag_dir, f.names, [optim, states, *([experts] if experts else [])], self.words
        )
        self.findings += claims.findings
        f.optim = {k[0]: p for k, p in claims.of(optim).items()}
        if not f.optim:
            raise NotACheckpointError(
                f"{self.loc.tag_dir}: none of its optimizer files belongs to this run ({claims.findings[0].message})",
                hint="Restore the tag folder from one save.",
            )
        if stage3:
            f.zero3_model = {k[0]: p for k, p in claims.of(states).items()}
        f.experts = {(k[0], k[1]): p for k, p in claims.of(experts).items()} if experts else {}

    words = "this data-parallel ZeRO checkpoint"  # the layout, as the claim pass's findings name it

    def _expert_role(self, model: ModelStates, stage3: bool) -> Role | None:
        """The role of the per-expert files (`moe`, `autoep`); None: this layout writes none."""
        return None

    def findings_have_errors(self) -> bool:
        return damaging(self.findings)  # a stray file was set aside: the proofs still run

    def _stage3_proof(self, param_shapes: ParamShapes, states: list[OptimStates]) -> list[Finding]:
        return stage3_rank_proof(param_shapes, states, self.loc.source, self._padding)  # autoep narrows it

    def _model_states(self, tree: Any, path: str, module: bool = True) -> ModelStates:
        """One model-states file's record, from the tree just loaded: a layout that reads more of the same
        file (AutoEP's records) parses it here, so no file is loaded twice. `module=False`: another stage-3
        rank's, whose module placeholders nothing reads (`ModelStates.parse`)."""
        return ModelStates.parse(tree, path, module)

    def _optim_states(self, tree: Any, path: str, stage3: bool) -> OptimStates:
        """One optimizer file's record, from the tree just loaded (as `_model_states`)."""
        return OptimStates.parse(tree, path, stage3)

    def _model(self, stage3: bool) -> ModelStates:
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
        tree = tree_at(self.trees, model_path, self.loc.source)  # kept for the layout's later checks
        model = self._model_states(tree, model_path)
        self._check_model_parallel(tree, model_path)
        if not model.has_module:
            raise UnsupportedCheckpointError(
                f"{model_path} has no module weights (pipeline-parallel run).",
                hint="Pipeline-parallel checkpoints are not supported yet.",
            )
        return model

    shard = False  # True while scan/tensor.py scans one tensor-parallel shard

    def _check_model_parallel(self, tree: Any, model_path: str) -> None:
        """A run with several model-parallel ranks whose other ranks' files are all missing: without this, the
        one shard left would scan as a whole model with shard shapes. A Ulysses sequence-parallel run records
        its SP size where a TP degree would be: said in words, never taken for missing shards."""
        from inspector.parse.layers import ParallelDims

        dims = ParallelDims.parse(tree, model_path)
        mp = dims.model_parallel
        if mp > 1 and not self.shard:
            self.add(
                Severity.ERROR,
                "missing-shard",
                f"The model states say the run had {mp:,} model-parallel (tensor-parallel) ranks, but only "
                "mp_rank_00's files are here: tensor-parallel rank 1 and the others are missing.",
                model_path,
                "Copy the complete checkpoint folder; every model-parallel rank writes its own files.",
            )
        if (sp := dims.sequence_parallel) > 1:
            ranks = dims.dp_world_size or sp
            self.add(
                Severity.INFO,
                "sequence-parallel",
                f"Ulysses sequence parallel: {sp} sequence-parallel ranks × {max(ranks // sp, 1)} data-parallel "
                f"({ranks} ranks; the model states record the SP size as tp_degree). Weights are replicated over "
                "the sequence-parallel ranks and ZeRO partitions over all ranks, so it is read as plain ZeRO.",
                model_path,
                "",
            )

    def _layout(self, read: Read) -> Layout | None:
        """Where every trainable parameter lives, if the rank files allow it; otherwise a finding says why."""
        tag_dir = self.loc.tag_dir
        complete, param_shapes, osd0 = read.complete, read.param_shapes, read.osd0
        layout: Layout | None = None
        if osd0 is not None and complete and param_shapes:
            build = stage3_layout if read.stage3 else stage12_layout
            try:
                layout = build(param_shapes, read.states())
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
                read.model.file,
                "This checkpoint predates DeepSpeed 0.3.14 or was not written by a ZeRO engine.",
            )
        elif not complete:
            names = [name for group in param_shapes or () for name, _ in group]
            left = (
                f"{len(names)} trainable tensors ({_some(names)}) cannot be rebuilt"
                if names
                else "Trainable parameters cannot be rebuilt"
            )
            self.add(
                Severity.ERROR,
                "incomplete",
                f"{left} because rank files are missing or unreadable (see above); a forced conversion leaves "
                "them out.",
                tag_dir,
            )
        return layout

    def _check_consistency(
        self, model: ModelStates, models: dict[int, ModelStates | None], optims: dict[int, OptimStates | None]
    ) -> None:
        """Files of one checkpoint agree on version, config and step; mixed runs do not."""

        def sig(o: OptimStates) -> tuple[Any, ...]:
            steps = self._steps.get(o.file) or steps_key(o.steps)
            return (o.ds_version, self._slim.key(o.ds_config), steps)

        sigs = {r: sig(o) for r, o in optims.items() if o is not None}
        if len({s[:2] for s in sigs.values()}) > 1 or len({s[2] for s in sigs.values()}) > 1:
            base = sigs[min(sigs)]
            odd = [r for r, s in sigs.items() if s != base]
            self.add(
                Severity.ERROR,
                "mixed-runs",
                f"Optimizer files disagree on DeepSpeed version, config or step (ranks {_rank_list(odd)} differ from "
                f"rank {min(sigs)}): files from different runs or tags are mixed together.",
                self.loc.tag_dir,
                "Restore the tag folder from one save; do not merge folders.",
            )
        model_sig = (model.ds_version, self._slim.key(model.ds_config))
        if sigs and model_sig != sigs[min(sigs)][:2]:
            self.add(
                Severity.ERROR,
                "mixed-runs",
                "The model-states file and the optimizer files come from "
                "different runs (version or config differ).",
                self.loc.tag_dir,
                "Restore the tag folder from one save; do not merge folders.",
            )
        steps = {r: m.global_steps for r, m in models.items() if m is not None}
        shapes = {r: m.param_shapes for r, m in models.items() if m is not None}  # typed: str names, int dims
        # the ranks of a save share one param_shapes object (`Slim`): each distinct one hashed once, not a
        # 1,270-name tuple hashed at every rank (22 ms at 1,024 ranks)
        distinct = {id(s): s for s in shapes.values()}.values()
        if len(set(steps.values())) > 1 or len(set(distinct)) > 1:
            first = min(steps)
            odd = [r for r in steps if (steps[r], shapes[r]) != (steps[first], shapes[first])]
            self.add(
                Severity.ERROR,
                "mixed-runs",
                f"Stage-3 model files disagree on global_steps or parameter shapes (ranks {_rank_list(odd)} differ "
                f"from rank {first}, which says global_steps={steps[first]}).",
                self.loc.tag_dir,
                "Restore the tag folder from one save.",
            )


_MODULE = frozenset({"module"})


def _some(names: list[str], shown: int = 3) -> str:
    """The first few names, and how many more: a finding names what it is about without listing thousands."""
    more = f", and {len(names) - shown} more" if len(names) > shown else ""
    return ", ".join(names[:shown]) + more


def _rank_list(ranks: Sequence[int], shown: int = 8) -> str:
    """Rank numbers as a list, the first few of thousands and how many more."""
    if len(ranks) <= shown:
        return str(list(ranks))
    return f"[{', '.join(map(str, ranks[:shown]))}, and {len(ranks) - shown:,} more]"
