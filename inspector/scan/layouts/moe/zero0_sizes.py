"""Which expert-parallel size each MoE layer of a ZeRO-off run used, when one model has several (FORMAT.md §3.7).

Without ZeRO the expert masters carry no names: each `ep_size_E` optimizer group holds, in module order, the
local experts of every MoE layer that ran at size E, and DeepSpeed writes nowhere which layers those were. Each
layer's expert count is known (`num_experts`), so a layer at size E adds n/E local experts to group E. Walking
the layers in order, each must continue exactly one group's sequence: shapes decide, and where two sizes fit by
shape the values decide (a master matched to a layer's expert must be what that expert's 16-bit copy holds,
cast). One answer or none; never a guess. The scan then proves every match of every rank's file as before.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping, Sequence

from inspector.errors import UnsupportedCheckpointError
from inspector.format.torchzip import TensorRef
from inspector.parse.layers import ParallelDims
from inspector.parse.zero_off import UnfusedFp16, UnfusedParam

_EP_NAME = re.compile(r"^ep_size_([0-9]{1,9})$")
Named = list[tuple[str, TensorRef]]
Casts = Callable[[Sequence[UnfusedParam], Named], bool]


def local_experts(copies: Sequence[Mapping[str, TensorRef]], n: int, size: int, ep_rank: int) -> Named | None:
    """Expert-parallel rank `ep_rank`'s local experts of one layer of `n` experts at `size`, with their 16-bit
    tensors in order (local j is global `ep_rank·n_local + j`); None when `n` experts cannot run at `size`."""
    if size < 1 or not n or n % size:
        return None
    local = n // size
    out: Named = []
    for expert in copies[ep_rank * local : (ep_rank + 1) * local]:
        out += list(expert.items())
    return out


def layer_sizes(
    layers: Mapping[int, Sequence[Mapping[str, TensorRef]]],
    num_experts: Sequence[int],
    groups: Mapping[int, Sequence[UnfusedParam]],
    casts: Casts,
) -> tuple[dict[int, int] | None, str]:
    """MoE layer -> its expert-parallel size, from expert-parallel rank 0's group per size (`groups`), or None
    with why. `casts(params, named)`: whether each master is its named 16-bit copy, cast."""
    at = dict.fromkeys(groups, 0)
    out: dict[int, int] = {}
    for layer, copies in sorted(layers.items()):
        n = num_experts[layer] if layer < len(num_experts) else 0
        fits = []
        for size, params in groups.items():
            named = local_experts(copies, n, size, 0)
            seg = params[at[size] : at[size] + len(named)] if named else ()
            if (
                named
                and len(seg) == len(named)
                and all(_shape(p) == r.shape for p, (_, r) in zip(seg, named, strict=True))
            ):
                fits.append((size, seg, named))
        if len(fits) > 1:
            fits = [f for f in fits if casts(f[1], f[2])]
        if len(fits) != 1:
            which = "none" if not fits else " and ".join(f"ep_size_{f[0]}" for f in fits)
            return None, f"MoE layer {layer} ({n} experts) continues {which} of the expert groups"
        size, _, named = fits[0]
        out[layer] = size
        at[size] += len(named)
    left = [s for s in groups if at[s] != len(groups[s])]
    if left:
        return None, f"the ep_size_{left[0]} group holds masters no MoE layer accounts for"
    return out, ""


def _shape(p: UnfusedParam) -> tuple[int, ...] | None:
    return p.master.shape if p.master is not None else p.shape()  # fp32: no master, its moments' shape


def named_groups(o: UnfusedFp16) -> dict[str, list[UnfusedParam]]:
    """A rank's optimizer groups by name, in its own order: DeepSpeed orders the MoE groups from a set, so two
    ranks may list them differently, and a very large group split in several keeps one name."""
    out: dict[str, list[UnfusedParam]] = {}
    for hyper, params in zip(o.hyperparams, [[f] for f in o.flats] if o.fused else o.groups, strict=False):
        out.setdefault(str(hyper.get("name", "")), []).extend(params)
    return out


def pieces(
    o: UnfusedFp16, params: list[UnfusedParam], names: Named, dense: bool
) -> tuple[list[UnfusedParam], Named]:
    """A group's masters and the names they are matched to in order: per parameter as saved (a dense group
    takes as many of the dense names as it holds), or FP16_Optimizer's flat blocks cut name by name at each
    name's shape (a dense block takes the names that fill it). What is left of a block stays one piece, so
    the counts differ and the group is refused rather than cut at a guess."""
    if not o.fused:
        return params, names[: len(params)] if dense else names
    out: list[UnfusedParam] = []
    taken = 0
    for flat in params:
        off = 0
        while off < flat.flat_numel() and taken < len(names):
            p = flat.piece(off, names[taken][1].shape)
            if p is None:
                break
            out.append(p)
            off += math.prod(names[taken][1].shape)
            taken += 1
        if off < flat.flat_numel() or not flat.flat_numel():
            out.append(flat)  # unexplained rest: a count mismatch below
    return out, names[:taken] if dense else names


def first_hyper(o: UnfusedFp16) -> dict[str, Mapping[str, object]]:
    """Each group name's first hyperparameters, in rank 0's order."""
    out: dict[str, Mapping[str, object]] = {}
    for hyper in o.hyperparams:
        out.setdefault(str(hyper.get("name", "")), hyper)
    return out


def size_of(hyper: Mapping[str, object], ep: int) -> int:
    """An expert group's expert-parallel size (its name's, else the run's); 0 for a dense group."""
    if m := _EP_NAME.match(str(hyper.get("name", ""))):
        return int(m.group(1))
    return ep if hyper.get("moe") is True else 0


def expert_names(
    copies: Mapping[int, list[dict[str, TensorRef]]],
    dims: ParallelDims,
    sizes: Mapping[int, int],
    size: int,
    e: int,
) -> list[tuple[str, TensorRef]]:
    """Expert-parallel rank e's local experts of every MoE layer at `size`, in order, with their 16-bit tensors."""
    out: list[tuple[str, TensorRef]] = []
    for layer, experts in sorted(copies.items()):
        n = dims.num_experts[layer] if dims.num_experts and layer < len(dims.num_experts) else 0
        if sizes.get(layer) == size:
            out += local_experts(experts, n, size, e) or []
    return out


def load_optimizer(tree: object, path: str) -> UnfusedFp16:
    """An expp file's optimizer record (any of the three ZeRO-off forms), or a refusal naming what it lacks."""
    got = UnfusedFp16.parse(tree, path)
    if got is None:  # none of FP16_UnfusedOptimizer, FP16_Optimizer or a plain torch optimizer's state
        raise UnsupportedCheckpointError(
            f"{path}: a ZeRO-off MoE optimizer file, but its optimizer state is of a kind not supported yet "
            "(neither fp32_groups, fp32_groups_flat nor a torch optimizer's state and param_groups)."
        )
    return got


def wrapper_name(o: UnfusedFp16 | None) -> str:
    """The ZeRO-off optimizer wrapper a rank file's record shows."""
    return (
        "torch optimizer" if o and o.plain else "FP16_Optimizer" if o and o.fused else "FP16_UnfusedOptimizer"
    )


__all__ = [
    "expert_names",
    "first_hyper",
    "layer_sizes",
    "load_optimizer",
    "local_experts",
    "named_groups",
    "pieces",
    "size_of",
    "wrapper_name",
]
