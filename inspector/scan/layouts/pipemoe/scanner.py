"""Pipeline + native MoE: each stage is a native-MoE ZeRO-1/2 world of its own (its `mp_rank_SS` model states,
its optimizer files per data-parallel rank, its expert files with MoE layers counted from 0 on the stage), so
each is scanned by the native-MoE scan; PipelineModule names are global (`2.moe.deepspeed_moe...`), so the
stages' tensors are laid side by side, never joined. Global rank of stage s, data-parallel rank d: s x dp + d
(DeepSpeed's pipe-data topology), which the expert placement and the stage rows say."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from inspector.errors import (
    DamagedCheckpointError,
    InspectorError,
    NotACheckpointError,
    UnsupportedCheckpointError,
)
from inspector.parse.layers import ParallelDims
from inspector.scan.claims import claim, expert_role, model_role, optim_role
from inspector.scan.files import RankFiles
from inspector.scan.holding import ExpertSpan, Holding
from inspector.scan.layouts.base import tree_at
from inspector.scan.layouts.moe import ZERO_OFF_WORDS
from inspector.scan.layouts.moe.scanner import scan_moe
from inspector.scan.locate import EXPERT_RE, Location
from inspector.scan.model import Checkpoint, FileInfo, Finding, GroupInfo, Parallel, RankInfo, TensorInfo
from inspector.scan.universal_needs import ExpertFiles, UniversalNeeds, zero_off
from inspector.system.units import plural

_WORDS = "this pipeline with native MoE (mp_rank_SS per stage, layer_L_expert_E_mp_rank_SS expert files)"
# DeepSpeed 0.19.8's own ds_to_universal crashes on it at EP 2 (FORMAT.md): nothing proves a universal
# checkpoint written from it resumes
NOT_PROVEN = (
    "a pipeline-parallel checkpoint with native MoE: DeepSpeed 0.19.8's own ds_to_universal fails on this "
    "layout and no universal checkpoint of it has been shown to resume, so none is written"
)


def is_pipeline_moe(loc: Location, names: Sequence[str], trees: dict[str, Any]) -> bool:
    """Expert files beside several `mp_rank_SS` model states whose rank-0 file records pipeline stages (the
    tree kept in `trees` for the scan)."""
    experts = any((m := EXPERT_RE.match(n)) and m.group(2) is not None for n in names)
    if not experts or "mp_rank_00_model_states.pt" not in names:
        return False
    path = os.path.join(loc.tag_dir, "mp_rank_00_model_states.pt")
    try:
        return (ParallelDims.parse(tree_at(trees, path, loc.source), path).pp_degree or 1) > 1
    except InspectorError:
        return False  # the tensor layout's scan reports what is wrong with it


def scan_pipeline_moe(loc: Location, names: Sequence[str], trees: dict[str, Any]) -> Checkpoint:
    """Every stage scanned as a native-MoE world, then the stages laid side by side."""
    path0 = os.path.join(loc.tag_dir, "mp_rank_00_model_states.pt")
    dims = ParallelDims.parse(tree_at(trees, path0, loc.source), path0)
    pp = dims.pp_degree or 1
    stages, findings = _stage_files(loc, names, pp, dims.num_experts)
    scanned = {s: scan_moe(loc, files, trees, stage=s) for s, files in sorted(stages.items())}
    _refuse_what_stages_share(loc, scanned)
    return _laid(scanned, findings, pp)


def _refuse_what_stages_share(loc: Location, scanned: dict[int, Checkpoint]) -> None:
    """Stages of one data-parallel size, each parameter on one stage: a module tied across stages
    (`tied_modules.*` on each) or stages of different widths are not read yet, and said so."""
    seen: dict[str, int] = {}
    for s, c in sorted(scanned.items()):
        if c.world_size != scanned[0].world_size:
            why = f"stage {s} has {c.world_size} data-parallel ranks, stage 0 {scanned[0].world_size}"
        elif (t := next((t.name for t in c.tensors if t.name in seen), None)) is not None:
            why = f"{t} is held by stage {seen[t]} and stage {s} (a module tied across stages)"
        else:
            seen.update(dict.fromkeys((t.name for t in c.tensors), s))
            continue
        raise UnsupportedCheckpointError(
            f"{loc.tag_dir}: pipeline parallel with native MoE where {why}: not supported yet.",
            hint="This says nothing about damage. Resume it with the DeepSpeed setup that wrote it.",
        )


def _stage_files(
    loc: Location, names: Sequence[str], pp: int, counts: Sequence[int] | None
) -> tuple[dict[int, RankFiles], list[Finding]]:
    """Each stage's files, every file of the folder claimed (scan/claims.py): one model states per stage,
    optimizer files per (data-parallel rank, stage), expert files per (stage MoE layer, global expert, stage)."""
    if pp > len(names):
        raise NotACheckpointError(
            f"{loc.tag_dir}: the model states record {pp:,} pipeline stages, but the folder holds only "
            f"{len(names)} files.",
            hint="The model-states file is damaged or crafted.",
        )
    roles = [model_role(pp), optim_role(len(names), pp)]
    roles.append(expert_role(dict(enumerate(counts)) if counts is not None else None, pp))
    claims = claim(loc.tag_dir, names, roles, _WORDS)
    stages = {s: RankFiles(present=len(names), names=tuple(names)) for s in range(pp)}
    for (s,), p in claims.of(roles[0]).items():
        stages[s].model = p
    for (d, s), p in claims.of(roles[1]).items():
        stages[s].optim[d] = p
    for (layer, e, s), p in claims.of(roles[2]).items():
        stages[s].experts[(layer, e)] = p
    if not any(f.optim for f in stages.values()):
        raise UnsupportedCheckpointError(
            f"{loc.tag_dir}: pipeline parallel with native MoE saved without optimizer files (ZeRO off): "
            "recognised, and not supported yet (ZeRO-1/2 saves are read).",
            hint="This says nothing about damage. Resume it with the DeepSpeed setup that wrote it.",
        )
    for s, f in stages.items():
        if f.model is None or not f.optim:
            what = f"mp_rank_{s:02d}_model_states.pt" if f.model is None else f"every *_mp_rank_{s:02d}_optim_states.pt"
            raise DamagedCheckpointError(
                f"{loc.tag_dir}: pipeline stage {s} lacks {what}; every stage of this pipeline with native MoE "
                "writes its model states and its optimizer files.",
                hint="Copy the complete checkpoint folder.",
            )
    return stages, list(claims.findings)


def _laid(scanned: dict[int, Checkpoint], findings: list[Finding], pp: int) -> Checkpoint:
    """The stages side by side: tensors (their optimizer groups renumbered, their stage recorded), groups,
    ranks (global), files and findings; the placement per stage and per MoE layer in global ranks."""
    base = scanned[0]
    dp = base.world_size
    tensors: list[TensorInfo] = []
    groups: list[GroupInfo] = []
    ranks: list[RankInfo] = []
    files: list[FileInfo] = []
    rows: list[Holding] = []
    for s, c in sorted(scanned.items()):
        off = len(groups)
        groups += [replace(g, index=g.index + off) for g in c.groups]
        tensors += [
            replace(t, group=None if t.group is None else t.group + off, stage=s) for t in c.tensors
        ]
        ranks += [_global_rank(r, s, dp, off) for r in c.ranks]
        files += [replace(f, mp_rank=s) for f in c.files]
        findings += [f for f in c.findings if f not in findings]
        layers = sorted({int(head) for t in c.tensors if (head := t.name.split(".", 1)[0]).isdigit()})
        rows.append(Holding(stage=s, layers=tuple(layers), ranks=tuple(s * dp + d for d in range(c.world_size))))
        rows += [_global_holding(h, s, dp) for h in (c.parallel.placement if c.parallel else ())]
    ep = base.parallel.ep if base.parallel else 1
    par = Parallel("pipeline", pp=pp, ep=ep, dp=dp, placement=tuple(rows))
    words = f"pipeline parallel with native MoE: {plural(pp, 'stage')} × EP {ep} × expert-DP {dp // max(ep, 1) or 1}"
    needs = UniversalNeeds(ExpertFiles.LOCAL_SLOTS, zero_off("expert", ZERO_OFF_WORDS), not_offered=NOT_PROVEN)
    return replace(
        base,
        world_size=pp * dp,
        files=tuple(files),
        ranks=tuple(ranks),
        groups=tuple(groups),
        tensors=tuple(tensors),
        findings=tuple(findings),
        module_copy_bytes=sum(c.module_copy_bytes for c in scanned.values()),
        parallel=replace(par, words=f"{words} ({plural(pp * dp, 'rank')})"),
        universal=needs,
    )


def _global_rank(r: RankInfo, s: int, dp: int, off: int) -> RankInfo:
    groups = tuple(replace(g, group=g.group + off) for g in r.groups)
    return replace(r, rank=s * dp + r.rank, groups=groups)


def _global_holding(h: Holding, s: int, dp: int) -> Holding:
    """A stage's MoE-layer row with its ranks global."""
    spans = tuple(ExpertSpan(e.experts, tuple(s * dp + r for r in e.ranks)) for e in h.experts)
    return replace(h, experts=spans, ranks=tuple(s * dp + r for r in h.ranks))


__all__ = ["is_pipeline_moe", "scan_pipeline_moe"]
