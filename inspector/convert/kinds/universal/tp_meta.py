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

A split stated with `--tp-split` (no usable record) has only the 0 / 1 / replicated rules: cat_dim 0,
cat_dim 1, nothing. The scan reads the record once (`Parallel.tp_recipe`); nothing here opens a file.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

from inspector.parse.layers import SubParams
from inspector.scan.model import Checkpoint, Kind, TensorInfo

Meta = tuple[tuple[str, Any], ...]
PLAIN: Meta = (("cat_dim", 0),)
ROW: Meta = (("cat_dim", 1),)
REPLICATED: Meta = ()
TWO_SUB_PARAMS: Meta = (("cat_dim", 0), ("param_n_sub_params", 2))
VOCAB_FLAG = ("vocab_tensor", True)


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
    `cat_dim` 0, as for a data-parallel checkpoint), from the split the scan joined the shards by."""
    par = ckpt.parallel
    recipe = par.tp_recipe if par is not None and par.tp > 1 else None  # recorded by a tensor-parallel scan
    if recipe is None:
        return {}
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
    recipe = par.tp_recipe if par is not None and par.tp > 1 else None
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


def _params(ckpt: Checkpoint) -> list[TensorInfo]:
    return [t for t in ckpt.tensors if t.kind in (Kind.TRAINABLE, Kind.FROZEN)]
