"""Native MoE checkpoints (`deepspeed.moe.layer.MoE` under ZeRO-1/2, FORMAT.md §3.7 and "Expert, pipeline
and tensor parallel files").

The optimizer files hold a dense group (over all ranks) and one `ep_size_E` group per expert-parallel size,
named in each rank's own `param_groups`: DeepSpeed orders the MoE groups from a Python set, so two ranks may
list them in different orders, and a large group may be split into several groups of one name; groups are
therefore matched by (name, occurrence), never by position. Rank R is expert-parallel rank `R mod E` and
expert-data-parallel rank `R div E`; each expert-parallel rank's flat group is rebuilt from its expert-DP
ranks with the data-parallel rules (`layout.stage12_layout`), then local expert j of expert-parallel rank e
becomes global expert `e·n_local + j`. The 16-bit experts are in `layer_L_expert_E_mp_rank_MM_…` files under
global names; the dense weights in `mp_rank_00`'s `module`, as for any ZeRO-1/2 run.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from inspector.errors import InspectorError
from inspector.format.torchzip import TensorRef
from inspector.parse.layers import ParallelDims
from inspector.parse.states import ModelStates, OptimStates
from inspector.scan.claims import Role, expert_role
from inspector.scan.files import RankFiles, expert_copies
from inspector.scan.holding import Holding, expert_spans
from inspector.scan.layout import Layout, ParamShapes, stage12_layout
from inspector.scan.layouts.zero.scanner import Read, ZeroScanner
from inspector.scan.locate import Location
from inspector.scan.model import (
    Checkpoint,
    FileInfo,
    Finding,
    GroupInfo,
    Parallel,
    RankGroup,
    Segment,
    Severity,
)
from inspector.system.bytesource import ByteSource

EXPERT_NAME = re.compile(r"^(.*\.deepspeed_experts\.)(\d+)(\..+)$")
_EP_NAME = re.compile(r"^ep_size_(\d+)$")


def scan_moe(loc: Location, files: RankFiles, trees: dict[str, Any], *, stage: int | None = None) -> Checkpoint:
    """Scan a native-MoE tag folder: the data-parallel scan with the expert-parallel layout of §3.7; `trees`:
    what the claims loaded (`Found.trees`); `stage`: the files are this pipeline stage's (`mp_rank_SS`), which
    the calling layout claimed with the rest of the folder."""
    scanner = _MoEScanner(loc, files, trees)
    scanner.shard, scanner.mp_rank = stage is not None, stage or 0
    ckpt = scanner.build()
    extra = tuple(FileInfo.stat(p, "expert", None) for _, p in sorted(files.experts.items()))
    copies = sum(s.nbytes for t in ckpt.tensors if EXPERT_NAME.match(t.name) for s in t.module_copy)
    return replace(
        ckpt,
        files=ckpt.files + extra,
        parallel=scanner.parallel,
        findings=tuple(scanner.findings),
        module_copy_bytes=ckpt.module_copy_bytes + copies,
    )


class _MoEScanner(ZeroScanner):
    parallel: Parallel | None = None
    mp_rank = 0  # the model-parallel rank (pipeline stage) whose files these are
    words = "this MoE checkpoint"

    def __init__(self, loc: Location, files: RankFiles, trees: dict[str, Any]) -> None:
        super().__init__(loc, files, trees)
        self._dims: dict[str, ParallelDims | InspectorError] = {}  # per model-states file, from its tree

    def _model_states(self, tree: Any, path: str, module: bool = True) -> ModelStates:
        model = super()._model_states(tree, path, module)
        try:
            self._dims[path] = ParallelDims.parse(tree, path)
        except InspectorError as exc:  # missing_experts reports the damaged record
            self._dims[path] = exc
        return model

    def _expert_role(self, model: ModelStates, stage3: bool) -> Role:
        """Expert files for the MoE layers and expert counts the model states record (`num_experts`)."""
        dims = self._dims.get(model.file)
        counts = dims.num_experts if isinstance(dims, ParallelDims) else None
        return expert_role(dict(enumerate(counts)) if counts is not None else None, 1)

    def _layout(self, read: Read) -> Layout | None:
        param_shapes = read.param_shapes
        if read.stage3 or not param_shapes or not read.complete:
            return super()._layout(read)
        try:
            lay, parallel = _moe_layout(param_shapes, read.states(), self.files, self.loc.source)
        except InspectorError as exc:
            self.add(Severity.ERROR, "layout", exc.message, self.loc.tag_dir, exc.hint)
            return None
        self.parallel = parallel
        self.findings += lay.findings
        dims = self._dims[read.model.file]  # parsed with the rank-0 model states (`_model`)
        self.findings += missing_experts(read.model, dims, self.files, self.loc.tag_dir, self.mp_rank)
        return lay


def _group_keys(states: Sequence[OptimStates], param_shapes: ParamShapes) -> list[list[tuple[str, int]]]:
    """Per rank, each of its groups as (name, occurrence): the key that matches groups across ranks."""
    out = []
    for st in states:
        if len(st.groups) != len(param_shapes):
            raise InspectorError(
                f"{st.file}: {len(st.groups)} optimizer groups, param_shapes has {len(param_shapes)}.",
                hint="Model and optimizer files come from different runs, or the file is damaged.",
            )
        seen: dict[str, int] = {}
        keys = []
        for g in st.groups:
            name = (
                str(g.hyperparams.get("name", "")) if isinstance(g.hyperparams.get("name", ""), str) else ""
            )
            keys.append((name, seen.get(name, 0)))
            seen[name] = seen.get(name, 0) + 1
        out.append(keys)
    if any(sorted(k) != sorted(out[0]) for k in out):
        raise InspectorError(
            "The optimizer files list different parameter groups (by name): files from different runs are mixed.",
            hint="Restore the tag folder from one save.",
        )
    return out


def _moe_layout(
    param_shapes: ParamShapes,
    states: Sequence[OptimStates],
    files: RankFiles,
    source: ByteSource,
) -> tuple[Layout, Parallel]:
    """Every group rebuilt per expert-parallel rank from its expert-DP ranks; experts renamed to global ids."""
    ws = len(states)
    keys = _group_keys(states, param_shapes)
    lay = Layout()
    groups: list[GroupInfo] = []
    rank_groups: list[list[RankGroup]] = [[] for _ in range(ws)]
    experts = expert_copies(files, source, lay.findings)
    holders: dict[str, dict[int, list[int]]] = {}  # layer prefix -> global expert -> ranks
    eps = set()
    for g, shapes in enumerate(param_shapes):
        key = keys[0][g]
        ep = _ep_size(key[0], states[0].groups[g].hyperparams)
        if ws % ep:
            raise InspectorError(
                f"Group {key[0]!r} has expert-parallel size {ep}, which does not divide the "
                f"{ws} optimizer files.",
                hint="Rank files are missing or come from another run.",
            )
        eps.add(ep)
        for e in range(ep):
            ranks = list(range(e, ws, ep))  # expert-DP group of expert-parallel rank e, in expert-DP order
            sub = [replace(states[r], groups=(states[r].groups[keys[r].index(key)],)) for r in ranks]
            part = stage12_layout((shapes,), sub)
            index = len(groups)
            lay.findings += [
                replace(f, message=f"Group {key[0] or g} (expert-parallel rank {e}): {f.message}")
                for f in part.findings
            ]
            if part.master_dtype != "float32":
                lay.master_dtype = part.master_dtype
            groups += [
                replace(
                    gi,
                    index=index,
                    hyperparams={**gi.hyperparams, "ep_rank": e} if ep > 1 else gi.hyperparams,
                )
                for gi in part.groups
            ]
            for d, r in enumerate(ranks):
                rank_groups[r] += [replace(rg, group=index) for rg in part.rank_groups[d]]
            _add_params(lay, part, e, index, _local_counts(shapes), experts)
            for name in part.params:
                if m := EXPERT_NAME.match(_global(name, e, _local_counts(shapes))):
                    holders.setdefault(m.group(1), {}).setdefault(int(m.group(2)), ranks)
    lay.groups = tuple(groups)
    lay.rank_groups = [tuple(rg) for rg in rank_groups]
    ep_max = max(eps) if eps else 1
    rows = tuple(
        Holding(prefix.rstrip("."), expert_spans(by_expert)) for prefix, by_expert in sorted(holders.items())
    )
    return lay, Parallel("expert", ep=ep_max, dp=ws, placement=rows)


def _add_params(
    lay: Layout,
    part: Layout,
    e: int,
    index: int,
    n_local: Mapping[str, int],
    experts: Mapping[str, TensorRef],
) -> None:
    """Expert-parallel rank e's rebuilt tensors under their global names, in global group `index`, each with
    its 16-bit copy from the expert files."""
    for name, t in part.params.items():
        full = _global(name, e, n_local)
        t = replace(t, name=full, group=index)
        copy = experts.get(full)
        if copy is not None and copy.numel == t.numel:
            t = replace(t, module_copy=tuple(Segment(copy.path, o, n, copy.dtype) for o, n in copy.runs()))
        if full in lay.params:
            raise InspectorError(
                f"Parameter {full} is rebuilt twice (expert-parallel groups overlap).",
                hint="The optimizer files do not describe one run.",
            )
        lay.params[full] = t


def _ep_size(name: str, hyper: Mapping[str, object]) -> int:
    """An expert group's expert-parallel size from its name `ep_size_E`; 1 for the dense groups."""
    m = _EP_NAME.match(name)
    if hyper.get("moe") is True or m:
        if not m:
            raise InspectorError(
                f"An expert parameter group is named {name!r}, not ep_size_<E>.",
                hint="The optimizer file is damaged or was not written by DeepSpeed's MoE.",
            )
        return max(1, int(m.group(1)))
    return 1


def _local_counts(shapes: Sequence[tuple[str, tuple[int, ...]]]) -> dict[str, int]:
    """Local experts per MoE layer (name prefix) in one expert-parallel rank's group."""
    ids: dict[str, set[int]] = {}
    for name, _ in shapes:
        if m := EXPERT_NAME.match(name):
            ids.setdefault(m.group(1), set()).add(int(m.group(2)))
    return {p: len(v) for p, v in ids.items()}


def _global(name: str, e: int, n_local: Mapping[str, int]) -> str:
    m = EXPERT_NAME.match(name)
    if not m:
        return name
    return f"{m.group(1)}{e * n_local[m.group(1)] + int(m.group(2))}{m.group(3)}"


def missing_experts(
    model: ModelStates, dims: ParallelDims | InspectorError, files: RankFiles, tag_dir: str, mp: int = 0
) -> list[Finding]:
    """One finding per missing `layer_L_expert_E_mp_rank_MM` file, from `num_experts` (bounded by the files
    present); `dims`: the model states' parallel record, as the scan parsed it (or why it could not); `mp`:
    the model-parallel rank whose files these are (a pipeline stage)."""
    if isinstance(dims, InspectorError):
        return [Finding(Severity.ERROR, "unreadable", dims.message, model.file, dims.hint)]
    counts = dims.num_experts or ()
    if sum(counts) > files.present:
        return [
            Finding(
                Severity.ERROR,
                "missing-expert",
                f"The model states list {sum(counts):,} experts, but the "
                f"tag folder holds only {files.present} files.",
                model.file,
                "Expert files are missing, or the model-states file is damaged or crafted.",
            )
        ]
    missing = [
        (layer, e) for layer, n in enumerate(counts) for e in range(n) if (layer, e) not in files.experts
    ]
    hint = "Copy the complete checkpoint folder; each expert's 16-bit weights are in its own file."
    out = [
        Finding(
            Severity.ERROR,
            "missing-expert",
            f"The file of expert {e} of MoE layer {layer} "
            f"(layer_{layer}_expert_{e}_mp_rank_{mp:02d}_model_states.pt) is missing.",
            tag_dir,
            hint,
        )
        for layer, e in missing[:8]
    ]
    if len(missing) > 8:
        out.append(
            Finding(
                Severity.ERROR,
                "missing-expert",
                f"{len(missing) - 8} more expert files are missing.",
                tag_dir,
                hint,
            )
        )
    return out


__all__ = ["scan_moe"]
