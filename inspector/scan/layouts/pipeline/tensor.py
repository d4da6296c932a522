"""Pipeline x tensor-parallel checkpoints (`layer_XX-model_TT-model_states.pt`, as GPT-NeoX and Megatron-
DeepSpeed write them; FORMAT.md §1.2, §3.6, §4.2).

Each tensor-parallel rank's files form a complete pipeline of shards (its own layer files, one
`mp_rank_MM` per stage with MM = stage x tp + TT, its optimizer files): the pipeline scan rebuilds each, then
the shards join as the tensor-parallel scan joins them, by what `universal_checkpoint_info` records (Megatron-
DeepSpeed saves it in the client state) or, where nothing is recorded, by the user's `--tp-split`. Nothing is
guessed: a pipeline's layers carry no split of their own.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from inspector.errors import InspectorError, StoreError
from inspector.parse.dsconfig import DsConfig
from inspector.parse.layers import ParallelDims, TpRecipe
from inspector.parse.states import ModelStates
from inspector.scan.claims import Claims, bounded
from inspector.scan.layouts.base import tree_at
from inspector.scan.layouts.pipeline.files import claim_files, tp_layer_ranks
from inspector.scan.layouts.pipeline.scanner import Pipeline
from inspector.scan.layouts.tensor.scanner import join_shards
from inspector.scan.locate import Location
from inspector.scan.model import Checkpoint, Finding, Parallel, Severity, TensorInfo


def scan_pipeline_tensor(
    loc: Location,
    names: Sequence[str],
    tp_split: Sequence[tuple[str, str]] = (),
    trees: dict[str, Any] | None = None,
) -> Checkpoint:
    """Scan a pipeline tag folder: one pipeline per tensor-parallel rank, joined (tp 1: the pipeline itself).
    `trees`: the object trees this scan already loaded (`Found.trees`): each stage's model states once."""
    trees = {} if trees is None else trees
    model0 = os.path.join(loc.tag_dir, "mp_rank_00_model_states.pt")
    tree0 = tree_at(trees, model0, loc.source) if "mp_rank_00_model_states.pt" in names else None
    dims = ParallelDims.parse(tree0, model0) if tree0 is not None else None
    held = tp_layer_ranks(list(names))
    tp = (dims.tp_degree if dims else None) or (max(held) + 1 if held else 1)
    claims = _claims(loc, names, tp, tree0, dims)  # a layer file of another TP rank: a stray-file error
    only = frozenset(claims.names())
    held = tp_layer_ranks(sorted(only))
    if tp == 1:
        ckpt = Pipeline(loc, only=only, trees=trees).build()
        return replace(ckpt, findings=(*claims.findings, *ckpt.findings))
    findings: list[Finding] = list(claims.findings)
    if tp > len(names):
        findings.append(
            Finding(
                Severity.ERROR,
                "world-size",
                f"The model states say tp_degree={tp:,}, but the tag folder holds only {len(names)} files.",
                model0,
            )
        )
        tp = max(held) + 1 if held else 1
    for t in range(tp):
        if t not in held:
            findings.append(
                Finding(
                    Severity.ERROR,
                    "missing-shard",
                    f"The layer files of tensor-parallel rank {t} (layer_XX-model_{t:02d}-model_states.pt) are "
                    "missing.",
                    loc.tag_dir,
                    "Copy the complete checkpoint folder; every tensor-parallel rank writes its own layer files.",
                )
            )
    scanned = _shards(loc, tp, held, findings, only, trees)
    if not scanned:  # layer files without a model axis, yet tp_degree > 1: refused there, with the reason
        return Pipeline(loc).build()
    recipe = TpRecipe.parse(tree0, model0) if tree0 is not None else None
    tensors, used = join_shards(scanned, tp, recipe, tp_split, findings, loc, trees)
    return _joined(scanned, tp, tensors, findings, used)


def _claims(loc: Location, names: Sequence[str], tp: int, tree0: object, dims: ParallelDims | None) -> Claims:
    """The claim pass over the folder with the run's degrees as mp_rank_00 records them (none recorded, or
    more than the files present: only the files present bound them)."""
    present = len(names)
    path = os.path.join(loc.tag_dir, "mp_rank_00_model_states.pt")
    model = ModelStates.parse(tree0, path) if tree0 is not None else None
    pp = bounded(dims.pp_degree if dims else None, present)
    if pp is None and dims is not None and dims.mp_world_size is not None:
        pp = bounded(dims.mp_world_size // tp or None, present)
    dp = bounded(model.dp_world_size if model else None, present)
    return claim_files(loc, list(names), tp, pp, dp, model.ds_config if model else DsConfig())


def _shards(
    loc: Location, tp: int, held: set[int], findings: list[Finding], only: frozenset[str], trees: dict[str, Any]
) -> dict[int, Checkpoint]:
    """Each tensor-parallel rank's pipeline; its findings added, naming the rank. A rank whose essential file
    (its first stage's model states) is lost is a finding too: only rank 0's refuses the whole folder."""
    out: dict[int, Checkpoint] = {}
    for t in sorted(held):
        try:
            out[t] = Pipeline(loc, t, tp, only, trees).build()
        except StoreError:
            raise  # the store refused (credentials, throttling): not a finding about the files
        except InspectorError as exc:
            if t == 0:
                raise
            findings.append(
                Finding(
                    Severity.ERROR,
                    "missing-shard",
                    f"Tensor-parallel rank {t}: {exc.message}",
                    loc.tag_dir,
                    exc.hint,
                )
            )
            continue
        for f in out[t].findings:
            if f not in loc.findings:
                f = replace(f, message=f"Tensor-parallel rank {t}: {f.message}")
            if f not in findings:
                findings.append(f)
    return out


def _joined(
    scanned: dict[int, Checkpoint],
    tp: int,
    tensors: list[TensorInfo],
    findings: list[Finding],
    recipe: TpRecipe | None,
) -> Checkpoint:
    """The first shard's record with the joined tensors, every shard's files and ranks (global rank =
    (stage x dp + data-parallel rank) x tp + tensor-parallel rank, as the topology numbers them)."""
    base = next(iter(scanned.values()))
    par = base.parallel or Parallel("pipeline")
    ranks = [replace(r, rank=r.rank * tp + t) for t, c in sorted(scanned.items()) for r in c.ranks]
    rows = [
        (i, t, replace(h, shard=t))
        for t, c in scanned.items()
        for i, h in enumerate(c.parallel.placement if c.parallel else ())
    ]
    placement = tuple(h for _, _, h in sorted(rows, key=lambda row: row[:2]))  # stage by stage
    return replace(
        base,
        tensors=tuple(tensors),
        findings=tuple(findings),
        world_size=base.world_size * tp,
        files=tuple(f for c in scanned.values() for f in c.files),
        ranks=tuple(sorted(ranks, key=lambda r: r.rank)),
        module_copy_bytes=sum(c.module_copy_bytes for c in scanned.values()),
        parallel=replace(par, tp=tp, placement=placement, tp_recipe=recipe),
    )


__all__ = ["scan_pipeline_tensor"]
