"""Tensor-parallel shards joined as lists of byte ranges (FORMAT.md §4.2): on dim 0 (vocabulary rows cut to
their original count), on dim 1 (row-parallel), or, for a fused parameter, sub-parameter by sub-parameter.

A fused parameter (`qkv_proj`, `gate_up_proj`) is cut per sub-parameter: shard t holds rows
[off_i(t), off_i(t) + widths[i][t]) of sub-parameter i along the partition dim, its sub-parameters one after
another; the full tensor is sub-parameter 0 from every shard in turn, then sub-parameter 1, and so on, as
DeepSpeed's `ds_to_universal` merges it. The widths come from the record (UCP 0.4's `sub_param_shard_widths`),
or, for an older record, an even split of the recorded sizes; `parameter_with_2_sub_params_cat_dim_0` is two
equal halves of every shard on dim 0. Nothing is guessed: widths that do not add up are an error.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from inspector.errors import InspectorError
from inspector.format.dtypes import itemsize
from inspector.parse.layers import SubParams
from inspector.scan.model import Segment

Segs = tuple[Segment, ...]
Widths = tuple[tuple[int, ...], ...]
_MAX_PIECES = (
    1 << 24
)  # joins across a dim > 0: outer rows x pieces (an 8192-row weight over 8 shards: 65,536)


def joined_shape(shapes: list[tuple[int, ...]], dim: int, keep: int | None, name: str) -> tuple[int, ...]:
    s0 = shapes[0]
    if len(s0) <= dim or any(
        len(s) != len(s0) or s[:dim] + s[dim + 1 :] != s0[:dim] + s0[dim + 1 :] for s in shapes
    ):
        raise InspectorError(
            f"{name}: shard shapes {sorted(set(shapes))} cannot join on dim {dim}.",
            hint="The shards come from different runs, or the recorded split is wrong.",
        )
    full = sum(s[dim] for s in shapes)
    if keep is not None and dim == 0:
        if keep > full:
            raise InspectorError(
                f"{name}: original_vocab_size {keep:,} is larger than the {full:,} rows saved."
            )
        full = keep
    return (*s0[:dim], full, *s0[dim + 1 :])


def cat(shapes: list[tuple[int, ...]], segs: Sequence[Segs], dim: int, keep: int | None) -> Segs:
    """Segments of the shards joined on `dim` (0 or 1), the first `keep` rows only when given (dim 0)."""
    if dim == 0:
        flat = tuple(s for part in segs for s in part)
        if keep is None:
            return flat
        return tuple(sub(flat, 0, keep * math.prod(shapes[0][1:])))
    rows = shapes[0][0]
    if rows * len(segs) > _MAX_PIECES:  # one piece per row and shard: a shape no real model has
        raise InspectorError(
            f"Joining on dim 1 would take {rows * len(segs):,} pieces ({rows:,} rows).",
            hint="The parameter shapes are damaged or crafted.",
        )
    inner = [math.prod(s[1:]) for s in shapes]
    out: list[Segment] = []
    for i in range(rows):
        for part, w in zip(segs, inner, strict=True):
            for s in sub(part, i * w, w):
                last = out[-1] if out else None
                if (
                    last
                    and last.file == s.file
                    and last.dtype == s.dtype
                    and last.offset + last.nbytes == s.offset
                ):
                    out[-1] = Segment(last.file, last.offset, last.numel + s.numel, last.dtype)
                else:
                    out.append(s)
    return tuple(out)


def sub(segs: Segs, start: int, count: int) -> list[Segment]:
    """Segments for elements [start, start+count) of the tensor `segs` make up."""
    out, pos, end = [], 0, start + count
    for s in segs:
        lo, hi = max(start, pos), min(end, pos + s.numel)
        if lo < hi:
            out.append(Segment(s.file, s.offset + (lo - pos) * itemsize(s.dtype), hi - lo, s.dtype))
        pos += s.numel
        if pos >= end:
            break
    return out


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


def sub_params_shape(shapes: Sequence[tuple[int, ...]], dim: int) -> tuple[int, ...]:
    s0 = shapes[0]
    if any(len(s) != len(s0) or s[:dim] + s[dim + 1 :] != s0[:dim] + s0[dim + 1 :] for s in shapes):
        raise InspectorError(
            f"Shard shapes {sorted(set(shapes))} differ outside the partition dim {dim}.",
            hint="The shards come from different runs, or the recorded split is wrong.",
        )
    return (*s0[:dim], sum(s[dim] for s in shapes), *s0[dim + 1 :])


def cat_sub_params(shapes: Sequence[tuple[int, ...]], segs: Sequence[Segs], dim: int, widths: Widths) -> Segs:
    """Segments of a fused parameter: for each outer index (the dims before `dim`), sub-parameter i's piece
    of every shard in turn, for i in order."""
    outer = math.prod(shapes[0][:dim])
    inner = math.prod(shapes[0][dim + 1 :])
    if outer * len(widths) * len(segs) > _MAX_PIECES:
        raise InspectorError(
            f"Joining sub-parameters on dim {dim} would take {outer * len(widths) * len(segs):,} pieces.",
            hint="The parameter shapes are damaged or crafted.",
        )
    out: list[Segment] = []
    for o in range(outer):
        offsets = [0] * len(segs)
        for w in widths:
            for t, part in enumerate(segs):
                start = (o * shapes[t][dim] + offsets[t]) * inner
                _append(out, sub(part, start, w[t] * inner))
                offsets[t] += w[t]
    return tuple(out)


def _append(out: list[Segment], segs: Sequence[Segment]) -> None:
    """Append, merging a segment with the previous one when they are adjacent in one file."""
    for s in segs:
        last = out[-1] if out else None
        if last and last.file == s.file and last.dtype == s.dtype and last.offset + last.nbytes == s.offset:
            out[-1] = Segment(last.file, last.offset, last.numel + s.numel, last.dtype)
        else:
            out.append(s)
