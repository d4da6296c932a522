"""What a universal checkpoint needs from a model-parallel layout beyond the joined tensors (FORMAT.md §4).

Tensor parallel (AutoTP, pipeline x tensor parallel): the keys DeepSpeed's loader splits each file by again,
from the recorded split (`tp_meta.py`).

Native MoE: DeepSpeed's loader reads every parameter from `zero/<its name on the resuming rank>/`, and an
expert's name there is local (`deepspeed_experts.0` on every expert-parallel rank); a file that says
`is_expert_param` with `ep_num_experts` N is cut into N / ep_size blocks on dim 0 and expert-parallel rank r
takes block r (`universal_checkpoint.load_hp_checkpoint_state`, with the rank and size of the largest
expert-parallel group, for every MoE layer). So each local slot j of a layer is written as one stacked tensor
of N = the largest `ep_size` entries, entry r the expert that rank r holds in that slot (global expert
(r mod ep) * n_local + j of a layer with expert-parallel size ep). DeepSpeed resumes it at the same
expert-parallel sizes and any expert-data-parallel size (its own ds_to_universal fails on every native-MoE
layout).
"""

from __future__ import annotations

import re
from dataclasses import replace

from inspector.convert.kinds.universal.tp_meta import Meta, tp_metadata, tp_views
from inspector.errors import UnsupportedCheckpointError
from inspector.scan.model import Checkpoint, Kind, Segment, TensorInfo
from inspector.scan.universal_needs import ExpertFiles

_EXPERT = re.compile(r"^(.*\.deepspeed_experts\.)(\d+)(\..+)$")
_EP_GROUP = re.compile(r"^ep_size_(\d+)$")


def layout_metadata(ckpt: Checkpoint, tensors: tuple[TensorInfo, ...]) -> dict[str, Meta]:
    """Per parameter of `universal_view`, the keys its files carry beside `param` (absent: `cat_dim` 0), by
    how the layout said its experts are written (`Checkpoint.universal`)."""
    experts = ckpt.universal.experts
    if experts is ExpertFiles.FUSED:
        return autoep_metadata(ckpt, tensors)
    if experts is ExpertFiles.LOCAL_SLOTS:
        # a stacked expert: DeepSpeed's loader cuts it on dim 0 by expert-parallel rank
        ep = max(1, ckpt.parallel.ep if ckpt.parallel is not None else 1)
        stacked = (("cat_dim", 0), ("is_expert_param", True), ("ep_num_experts", ep))
        return {t.name: stacked for t in tensors if _EXPERT.match(t.name)}
    return tp_metadata(ckpt)


def autoep_metadata(ckpt: Checkpoint, tensors: tuple[TensorInfo, ...]) -> dict[str, Meta]:
    """AutoEP: each expert weight is one `[num_experts, ...]` tensor (the scan places the experts whole), and
    its files say so as `ds_to_universal` writes them; DeepSpeed's loader cuts the rank's experts out by them
    (`stage3._slice_autoep_universal_expert_param`, `universal_checkpoint._resolve_autoep_partition`)."""
    out: dict[str, Meta] = {}
    for t in tensors:
        group = ckpt.groups[t.group] if t.group is not None and t.group < len(ckpt.groups) else None
        name = group.hyperparams.get("name") if group is not None else None
        if isinstance(name, str) and _EP_GROUP.match(name) and t.shape:
            out[t.name] = (("cat_dim", 0), ("is_expert_param", True), ("ep_num_experts", int(t.shape[0])))
    return out


def universal_view(ckpt: Checkpoint) -> tuple[TensorInfo, ...]:
    """The tensors as the universal folder holds them: a native-MoE checkpoint's experts as one stacked
    tensor per layer and local slot (under the local name, group of its first entry), a tensor-parallel
    fused parameter in its recorded view's shape, the rest unchanged."""
    if ckpt.universal.experts is not ExpertFiles.LOCAL_SLOTS or ckpt.parallel is None:
        return tp_views(ckpt)  # a fused parameter split along a 3-D view in that view's shape
    ep_max = max(1, ckpt.parallel.ep)
    experts = {t.name: t for t in ckpt.tensors if _EXPERT.match(t.name) and t.kind is Kind.TRAINABLE}
    layers: dict[str, set[int]] = {}
    for name in experts:
        m = _EXPERT.match(name)
        assert m is not None
        layers.setdefault(m.group(1), set()).add(int(m.group(2)))
    out, done = [], set()
    for t in ckpt.tensors:
        m = _EXPERT.match(t.name) if t.name in experts else None
        if m is None:
            out.append(t)
            continue
        ep = _layer_ep(ckpt, t, ep_max)
        count = len(layers[m.group(1)])
        if count % ep:
            raise UnsupportedCheckpointError(
                f"{m.group(1).rstrip('.')}: {count} experts do not split over expert-parallel size {ep}."
            )
        local = count // ep
        j = int(m.group(2)) % local
        slot = f"{m.group(1)}{j}{m.group(3)}"
        if slot in done:
            continue
        done.add(slot)
        members = [f"{m.group(1)}{(r % ep) * local + j}{m.group(3)}" for r in range(ep_max)]
        missing = [n for n in members if n not in experts]
        if missing:
            raise UnsupportedCheckpointError(f"{slot}: expert {missing[0]} is not in the checkpoint.")
        out.append(_stacked(slot, [experts[n] for n in members]))
    return tuple(out)


def _layer_ep(ckpt: Checkpoint, t: TensorInfo, ep_max: int) -> int:
    """An expert's layer's expert-parallel size, from its optimizer group's name (`ep_size_E`)."""
    group = ckpt.groups[t.group] if t.group is not None and t.group < len(ckpt.groups) else None
    name = group.hyperparams.get("name") if group is not None else None
    m = _EP_GROUP.match(name) if isinstance(name, str) else None
    ep = int(m.group(1)) if m else 0
    if ep < 1 or ep_max % ep:
        raise UnsupportedCheckpointError(
            f"{t.name}: its layer's expert-parallel size ({str(name)[:40]!a}) does not divide the largest "
            f"({ep_max}); DeepSpeed's loader cuts every expert file by the largest expert-parallel group."
        )
    return ep


def _stacked(name: str, members: list[TensorInfo]) -> TensorInfo:
    def cat(parts: list[tuple[Segment, ...]]) -> tuple[Segment, ...]:
        return tuple(s for p in parts for s in p)

    first = members[0]
    names = [m for m, _ in first.moments]
    same = all([m for m, _ in x.moments] == names for x in members)  # else: no moments, refused by the plan
    moments = tuple((m, cat([dict(x.moments)[m] for x in members])) for m in names) if same else ()
    return replace(
        first,
        name=name,
        shape=(len(members), *first.shape),
        segments=cat([x.segments for x in members]),
        moments=moments,
        module_copy=(),
    )
