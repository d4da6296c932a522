"""The tensor-parallel keys of a universal checkpoint's files, for every layout with TP > 1 (AutoTP, pipeline x
tensor parallel): what `ds_to_universal`'s `merge_tp_slices` writes beside `param`, taken from the same record
the scan joined the shards by (`universal_checkpoint_info`, parsed as `TpRecipe`), never from shapes where a
record says otherwise (FORMAT.md §4.2).

DeepSpeed's loader (`universal_checkpoint.load_hp_checkpoint_state`) splits a file again by these keys for a
tensor-parallel target without AutoTP metadata of its own:

    replicated                      nothing (the whole tensor on every rank)
    row-parallel                    cat_dim 1
    two stacked sub-parameters      cat_dim 0, param_n_sub_params 2
    fused sub-parameters            sub_param_shape: SubparamShape(patterns, shape, partition_dim), as recorded
                                    (before UCP 0.4, a count at the partition dim becomes the equal sizes)
    described by an affine map      nothing: the converter rebuilds it from the map and the loader of an AutoTP
                                    target uses its own map
    anything else                   cat_dim 0
    vocabulary-parallel             vocab_tensor True as well (its padding rows already cut by the scan)

A split stated with `--tp-split` (no usable record) has only the 0 / 1 / replicated rules, which the shard
shapes the model states record tell apart exactly: those keys are read from them.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, replace
from typing import Any

from inspector.errors import UnsupportedCheckpointError
from inspector.format.torchzip import load_tree
from inspector.parse.layers import SubParams, TpRecipe
from inspector.parse.states import ModelStates
from inspector.scan.locate import MODEL_RE, ZERO3_MODEL_RE
from inspector.scan.model import Checkpoint, Kind, TensorInfo

Meta = tuple[tuple[str, Any], ...]
PLAIN: Meta = (("cat_dim", 0),)
ROW: Meta = (("cat_dim", 1),)
REPLICATED: Meta = ()
TWO_SUB_PARAMS: Meta = (("cat_dim", 0), ("param_n_sub_params", 2))
VOCAB_FLAG = ("vocab_tensor", True)
AFFINE_MAP_VERSION = 1  # the affine-map format DeepSpeed 0.19.8 reads (a later one it refuses)


@dataclass(frozen=True)
class SubparamShape:
    """`deepspeed.checkpoint.universal_checkpoint.SubparamShape`, pickled as that class (`tensors.py`)."""

    patterns: tuple[str, ...]
    shape: tuple[int | tuple[int, ...], ...]
    partition_dim: int
    shape_listed: bool = True  # pickled as a list, as the record held it

    def state(self) -> dict[str, Any]:
        shape = list(self.shape) if self.shape_listed else tuple(self.shape)
        return {"patterns": list(self.patterns), "shape": shape, "partition_dim": self.partition_dim}


def tp_metadata(ckpt: Checkpoint) -> dict[str, Meta]:
    """Per joined parameter, the keys its universal files carry (empty below TP 2: every file then gets
    `cat_dim` 0, as for a data-parallel checkpoint)."""
    par = ckpt.parallel
    if par is None or par.tp < 2 or par.kind not in ("tensor", "pipeline"):
        return {}
    model0 = _tp_rank0_models(ckpt, par.tp)
    if not model0:
        return {}
    recipe = TpRecipe.parse(load_tree(model0[0], ckpt.source), model0[0])
    if recipe is None or recipe.regex:  # the scan joined by the user's --tp-split
        return _from_shapes(ckpt, model0)
    _check_affine(recipe, model0[0])
    out: dict[str, Meta] = {}
    for t in _params(ckpt):
        rule = recipe.rules.get(t.name, "dim0")
        meta = _meta(t, rule, recipe.sub_params.get(t.name), t.name in recipe.affine)
        out[t.name] = (*meta, VOCAB_FLAG) if rule == "vocab" else meta
    return out


def tp_views(ckpt: Checkpoint) -> tuple[TensorInfo, ...]:
    """The tensors, a fused parameter split along a view of higher rank (AutoTP experts `[E, [rows], H]`)
    in that view's shape, as `ds_to_universal` writes it (its merge keeps the view); the bytes are the same
    in the same order, only the shape differs."""
    par = ckpt.parallel
    model0 = _tp_rank0_models(ckpt, par.tp) if par is not None and par.tp > 1 else []
    recipe = TpRecipe.parse(load_tree(model0[0], ckpt.source), model0[0]) if model0 else None
    if recipe is None or not recipe.sub_params:
        return ckpt.tensors
    out = []
    for t in ckpt.tensors:
        sub = recipe.sub_params.get(t.name)
        view = _view(t.shape, sub) if sub is not None and t.kind in (Kind.TRAINABLE, Kind.FROZEN) else None
        out.append(replace(t, shape=view) if view is not None else t)
    return tuple(out)


def _view(shape: tuple[int, ...], sub: SubParams) -> tuple[int, ...] | None:
    """The recorded view of a joined `shape` (the partition dim's sizes summed, a -1 resolved), or None
    where it has no more dims than the tensor or does not fit its size."""
    if len(sub.shape) <= len(shape):
        return None
    dims = [sum(d) if isinstance(d, tuple) else d for d in sub.shape]
    known = math.prod(d for d in dims if d != -1)
    if dims.count(-1) > 1 or known <= 0 or math.prod(shape) % known:
        return None
    view = tuple(math.prod(shape) // known if d == -1 else d for d in dims)
    return view if math.prod(view) == math.prod(shape) else None


def _meta(t: TensorInfo, rule: str, sub: SubParams | None, affine: bool) -> Meta:
    """The keys of one rule (`merge_tp_slices`' branches, in its order)."""
    if affine or rule == "replicated":
        return REPLICATED
    if rule == "2-sub-params":
        return TWO_SUB_PARAMS
    if rule == "sub-params" and sub is not None:  # the scan's "sub-params" rule comes with its record
        return (("sub_param_shape", _subparam_shape(t, sub)),)
    return ROW if rule == "row" else PLAIN


def _subparam_shape(t: TensorInfo, sub: SubParams) -> SubparamShape:
    """The record's SubparamShape; a count at the partition dim (before UCP 0.4) becomes the equal sizes it
    stands for, in a tuple shape, as `merge_tp_slices` normalizes it."""
    dim = sub.partition_dim
    if sub.sizes is not None or not sub.shape or dim >= len(t.shape):
        return SubparamShape(sub.patterns, sub.shape, dim, sub.shape_listed)
    count = sub.count or 1
    sizes = (t.shape[dim] // count,) * count
    shape = tuple(sizes if i == dim else d for i, d in enumerate(sub.shape))
    return SubparamShape(sub.patterns, shape, dim, shape_listed=False)


def _check_affine(recipe: TpRecipe, file: str) -> None:
    """An affine map decides which parameters carry no keys: one DeepSpeed could not read, or whose patterns
    are not plain names, leaves that unknown, so the export is refused rather than guessed."""
    if recipe.affine_version > AFFINE_MAP_VERSION:
        raise UnsupportedCheckpointError(
            f"{file} records an affine map of format version {recipe.affine_version}; DeepSpeed 0.19.8 reads "
            f"up to {AFFINE_MAP_VERSION}, so it could not resume a universal checkpoint written from it.",
            hint="Export the weights (--format weights or model); they are exact for this layout.",
        )
    if recipe.affine_regex:
        raise UnsupportedCheckpointError(
            f"{file}: {len(recipe.affine_regex)} affine-map pattern(s) are regular expressions (e.g. "
            f"{recipe.affine_regex[0][:60]!a}), not parameter names; which parameters they cover is not known "
            "without evaluating them.",
            hint="Export the weights (--format weights or model); they are exact for this layout.",
        )


def _params(ckpt: Checkpoint) -> list[TensorInfo]:
    return [t for t in ckpt.tensors if t.kind in (Kind.TRAINABLE, Kind.FROZEN)]


def _model_rank(name: str) -> int | None:
    """The model-parallel rank MM of a model-states file, `mp_rank_MM` or ZeRO-3's `zero_pp_rank_D_mp_rank_MM`."""
    m = MODEL_RE.match(name)
    if m is not None:
        return int(m.group(1))
    m = ZERO3_MODEL_RE.match(name)
    return int(m.group(2)) if m is not None else None


def _tp_rank0_models(ckpt: Checkpoint, tp: int) -> list[str]:
    """Tensor-parallel rank 0's model-states files, stage by stage (`mp_rank_MM` with MM = stage x tp + 0;
    under ZeRO-3 every data-parallel rank's `zero_pp_rank_D_mp_rank_MM` copy, which record the same); the
    first is `mp_rank_00` (`zero_pp_rank_0_mp_rank_00`), whose record the scan joined by."""
    found = []
    for f in ckpt.files:
        mm = _model_rank(os.path.basename(f.path)) if f.role == "model" else None
        if mm is not None and mm % tp == 0:
            found.append((mm, f.path))
    return [path for _, path in sorted(found)]


def _from_shapes(ckpt: Checkpoint, models: list[str]) -> dict[str, Meta]:
    """--tp-split: replicated where shard 0's recorded shape is the joined one, row where dim 1 differs, else
    dim 0 (the three rules --tp-split has, told apart exactly by the shapes)."""
    shard: dict[str, tuple[int, ...]] = {}
    for path in models:
        states = ModelStates.parse(load_tree(path, ckpt.source), path)
        shard |= {name: tuple(shape) for group in states.param_shapes or () for name, shape in group}
    out: dict[str, Meta] = {}
    for t in _params(ckpt):
        piece = shard.get(t.name)
        if piece is None:
            continue
        if piece == tuple(t.shape):
            out[t.name] = REPLICATED
        elif len(piece) > 1 and len(t.shape) > 1 and piece[1] != t.shape[1]:
            out[t.name] = ROW
        else:
            out[t.name] = PLAIN
    return out
