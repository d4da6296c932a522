"""Each tensor-parallel parameter's `Layout` from the records (FORMAT.md §4.2), checked against each other:
the affine map where it names the parameter (DeepSpeed follows it), compared with any category rule that
names it too and with the stored shard shapes; else the category rule's. The shards are then laid by
`scan/tensor_lay.py`, whatever record the layout came from.

A fused parameter (`qkv_proj`, `gate_up_proj`) is cut per sub-parameter: shard t holds rows
[off_i(t), off_i(t) + widths[i][t]) of sub-parameter i along the partition dim, its sub-parameters one after
another; the full tensor is sub-parameter 0 from every shard in turn, then sub-parameter 1, and so on, as
DeepSpeed's `ds_to_universal` merges it. The widths come from the record (UCP 0.4's `sub_param_shard_widths`),
or, for an older record, an even split of the recorded sizes; `parameter_with_2_sub_params_cat_dim_0` is two
equal halves of every shard on dim 0. Nothing is guessed: widths that do not add up are an error.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from inspector.errors import InspectorError
from inspector.format.torchzip import load_tree
from inspector.parse.affine import Layout, cut_rows, replicated, split, sub_params
from inspector.parse.layers import SubParams, TpRecipe
from inspector.scan.model import Checkpoint, Segment, TensorInfo
from inspector.system.bytesource import ByteSource

Widths = tuple[tuple[int, ...], ...]


def sub_param_widths(
    name: str, rule: str, spec: SubParams | None, shapes: Sequence[tuple[int, ...]], version: float
) -> tuple[int, Widths]:
    """(partition dim, widths[i][t]) of a fused parameter, from what the checkpoint records."""
    tp = len(shapes)
    if rule == "2-sub-params" or spec is None:
        if any(not s or s[0] % 2 for s in shapes):
            raise InspectorError(
                f"{name} is recorded as two sub-parameters stacked on dim 0, but a shard's dim 0 "
                f"({sorted({s[0] if s else 0 for s in shapes})}) is not even.",
                hint="The recorded split does not describe these shards.",
            )
        half = tuple(s[0] // 2 for s in shapes)
        return 0, (half, half)
    dim = spec.partition_dim
    if any(len(s) <= dim for s in shapes):
        raise InspectorError(f"{name}: the shards have no dimension {dim} (the recorded partition_dim).")
    if spec.widths is not None:
        widths = spec.widths
    elif version >= 0.4:
        raise InspectorError(
            f"{name}: universal checkpoint version {version} records sub-parameters but no "
            "sub_param_shard_widths for them.",
            hint="The widths decide each shard's cut; DeepSpeed's converter refuses this record too.",
        )
    else:
        full = sum(s[dim] for s in shapes)
        count = spec.count or 1
        sizes = spec.sizes or ((full // count,) * count if full % count == 0 else ())
        if not sizes or any(size % tp for size in sizes):
            raise InspectorError(
                f"{name}: sub-parameter sizes {list(sizes) or full} cannot be split evenly over {tp} shards, "
                "and the record (before UCP 0.4) has no widths for an uneven split."
            )
        widths = tuple((size // tp,) * tp for size in sizes)
    if (
        any(len(w) != tp for w in widths)
        or (spec.sizes is not None and [sum(w) for w in widths] != list(spec.sizes))
        or any(sum(w[t] for w in widths) != s[dim] for t, s in enumerate(shapes))
    ):
        raise InspectorError(
            f"{name}: the recorded sub-parameter widths {[list(w) for w in widths]} do not describe shards of "
            f"shapes {[list(s) for s in shapes]} on dim {dim}.",
            hint="The record or the shards are damaged, or come from different runs.",
        )
    return dim, widths


def sub_param_views(
    name: str, spec: SubParams | None, shapes: Sequence[tuple[int, ...]]
) -> list[tuple[int, ...]]:
    """Each shard as the record's view sees it. AutoTP may split a fused weight along a view of higher rank
    (experts `[E, [rows], H]` of a stored `[E*rows, H]`, partition dim 1): shard t `[E*w, H]` is then
    `[E, w, H]` flattened, w its widths' sum. A view of the shards' own rank (qkv's `[(q, k, v), -1]`) is
    the shards themselves; a view that does not fit a shard's size is an error, never a guess."""
    form = spec.shape if spec is not None else ()
    if spec is None or spec.widths is None or len(form) <= len(shapes[0]):
        return list(shapes)
    dim, tp = spec.partition_dim, len(shapes)
    if any(len(w) != tp for w in spec.widths):
        return list(shapes)  # sub_param_widths says the widths do not fit
    out = []
    for t, s in enumerate(shapes):
        dims = [sum(w[t] for w in spec.widths) if i == dim else d for i, d in enumerate(form)]
        ints = [d for d in dims if isinstance(d, int)]
        known = math.prod(d for d in ints if d != -1)
        numel = math.prod(s)
        if ints.count(-1) > 1 or len(ints) != len(dims) or known <= 0 or numel % known:
            raise _no_view(name, form, shapes)
        view = tuple(numel // known if d == -1 else d for d in ints)
        tail = s[1:]  # kept whole after the partition dim, so the leading dims fold back into dim 0
        if math.prod(view) != numel or len(tail) >= len(view) - dim or view[len(view) - len(tail) :] != tail:
            raise _no_view(name, form, shapes)
        out.append(view)
    return out


def stored_shape(joined: tuple[int, ...], shapes: Sequence[tuple[int, ...]]) -> tuple[int, ...]:
    """The full tensor in the shards' own rank: a joined view folded back (`[E, rows, H]` -> `[E*rows, H]`,
    as DeepSpeed's gather reshapes it to the original weight's shape)."""
    rank = len(shapes[0])
    if len(joined) <= rank:
        return joined
    tail = shapes[0][1:]
    return (math.prod(joined) // max(1, math.prod(tail)), *tail)


def _no_view(name: str, form: Sequence[object], shapes: Sequence[tuple[int, ...]]) -> InspectorError:
    return InspectorError(
        f"{name}: the recorded sub-parameter view {list(form)} does not fit shards of shapes "
        f"{[list(s) for s in shapes]}.",
        hint="The record or the shards are damaged, or come from different runs.",
    )


def category_layout(name: str, rule: str, recipe: TpRecipe, shapes: list[tuple[int, ...]]) -> Layout:
    """The `Layout` a category rule gives shards of these shapes (`merge_tp_slices`' branches): replicated,
    `row` on dim 1, fused sub-parameters by their widths, anything else on dim 0 (a vocabulary's padding
    is cut afterwards, from the map's layout as from this one: `vocab_cut`)."""
    source = f"{rule} rule of universal_checkpoint_info"
    if rule == "replicated":
        if len(set(shapes)) != 1:
            raise InspectorError(
                f"{name} is recorded as replicated, but its shards have shapes {sorted(set(shapes))}.",
                hint="The shards come from different runs, or the recorded split is wrong.",
            )
        return replicated(shapes, source)
    if rule in ("sub-params", "2-sub-params"):  # on the record's view of the shards (a 3-D view: experts)
        spec = recipe.sub_params.get(name)
        views = sub_param_views(name, spec, shapes) if rule == "sub-params" else shapes
        dim, widths = sub_param_widths(name, rule, spec, views, recipe.version)
        _same_outside(name, views, dim)
        return sub_params(views, dim, widths, source)
    dim = 1 if rule == "row" else 0
    _same_outside(name, shapes, dim)
    return split(shapes, dim, source)


def _same_outside(name: str, shapes: list[tuple[int, ...]], dim: int) -> None:
    s0 = shapes[0]
    if len(s0) <= dim or any(
        len(s) != len(s0) or s[:dim] + s[dim + 1 :] != s0[:dim] + s0[dim + 1 :] for s in shapes
    ):
        raise InspectorError(
            f"{name}: shard shapes {sorted(set(shapes))} cannot join on dim {dim}.",
            hint="The shards come from different runs, or the recorded split is wrong.",
        )


def vocab_cut(name: str, layout: Layout, keep: int | None) -> Layout:
    """A vocabulary-parallel parameter's first `original_vocab_size` rows, as DeepSpeed keeps them."""
    if keep is None or not layout.logical:
        return layout
    if keep > layout.logical[0]:
        raise InspectorError(
            f"{name}: original_vocab_size {keep:,} is larger than the {layout.logical[0]:,} rows saved."
        )
    return cut_rows(layout, keep)


class Refused(InspectorError):
    """A join refused with its own finding code."""

    def __init__(self, code: str, message: str, hint: str) -> None:
        super().__init__(message, hint=hint)
        self.code = code


def layout_of(name: str, rule: str, recipe: TpRecipe, shapes: list[tuple[int, ...]]) -> Layout:
    """One parameter's layout: the affine map's where it has one (DeepSpeed follows it), checked against
    the stored shard shapes and against any category rule that also names it; else the category rule's."""
    amap = recipe.maps.get(name)
    keep = recipe.original_vocab_size if rule == "vocab" else None
    if amap is None:
        return vocab_cut(name, category_layout(name, rule, recipe, shapes), keep)
    spec = recipe.sub_params.get(name)
    views = sub_param_views(name, spec, shapes) if rule == "sub-params" else shapes  # as the record sees them
    if list(amap.shards) != views:
        raise Refused(
            "tp-records-disagree",
            f"{name}: the affine map says its {len(amap.shards)} shards have shapes "
            f"{[list(s) for s in amap.shards]}; the model states record {[list(s) for s in views]}.",
            "The record and the shards come from different runs or were edited; nothing is converted.",
        )
    unwritten = rule == "sub-params" and spec is not None and spec.widths is None and recipe.version >= 0.4
    if name in recipe.rules and not unwritten:  # (UCP 0.4 needs no widths where a map says where rows go)
        try:
            listed = category_layout(name, rule, recipe, shapes)
        except InspectorError as exc:
            listed, why = None, exc.message
        if listed is None or not listed.same_as(amap):
            what = (
                f"cannot describe these shards ({why})" if listed is None else "puts its elements elsewhere"
            )
            raise Refused(
                "tp-records-disagree",
                f"{name}: universal_checkpoint_info's affine map and its {rule} rule disagree: the rule "
                f"{what}. DeepSpeed's converter would follow the map.",
                "The records were edited or come from different runs: nothing is converted, since either could "
                "be wrong. Re-save the checkpoint, or remove the record you know is wrong.",
            )
    return vocab_cut(name, amap, keep)


def records_differ(
    scanned: Mapping[int, Checkpoint], recipe: TpRecipe, source: ByteSource, trees: Mapping[str, Any]
) -> str | None:
    """The first other shard whose own model states record another split than shard 0's (each carries the
    whole model's `universal_checkpoint_info`); None when all agree or a shard records none. `trees`: the
    model-states trees the shard scans loaded, by path (a file is loaded here only if they did not)."""
    for t in sorted(scanned)[1:]:
        path = next((f.path for f in scanned[t].files if f.role == "model"), None)
        tree = (trees[path] if path in trees else load_tree(path, source)) if path is not None else None
        other = TpRecipe.parse(tree, path) if path is not None else None
        if other is not None and replace(other, file=recipe.file) != recipe:
            return path
    return None


def with_joined(
    t0: TensorInfo, pieces: list[TensorInfo], join: Callable[[Sequence[tuple[Segment, ...]]], tuple[Segment, ...]], shape: tuple[int, ...]
) -> TensorInfo:
    """t0 with its shards' masters, moments and 16-bit copies joined alike."""
    moments: tuple[tuple[str, tuple[Segment, ...]], ...] = ()
    if all(p.moments for p in pieces):
        moments = tuple((m, join([dict(p.moments)[m] for p in pieces])) for m, _ in t0.moments)
    copy = join([p.module_copy for p in pieces]) if all(p.module_copy for p in pieces) else ()
    return replace(
        t0, shape=shape, segments=join([p.segments for p in pieces]), moments=moments, module_copy=copy
    )
