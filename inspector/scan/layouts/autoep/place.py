"""AutoEP's affine maps applied to byte ranges: each expert-parallel rank's local shard (already rebuilt from
its stage-3 partitions as segments) cut into its pieces and laid into the logical all-experts tensor."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import replace

from inspector.errors import UnsupportedCheckpointError
from inspector.parse.autoep import ParamMap
from inspector.scan.holding import ExpertSpan, Holding
from inspector.scan.model import Segment, TensorInfo


def place(pmap: ParamMap, shards: Mapping[int, TensorInfo], group: int) -> TensorInfo:
    """The logical tensor of `pmap` from each expert-parallel rank's shard; its pieces must tile it exactly."""
    total = math.prod(pmap.logical_shape)
    spans: list[tuple[int, int, int, int]] = []  # (logical start, numel, ep rank, shard offset)
    for ep, shard in shards.items():
        if pmap.shard_shapes.get(ep) != shard.shape:
            raise UnsupportedCheckpointError(
                f"{pmap.name}: expert-parallel rank {ep}'s shard has shape {shard.shape}; its affine map says "
                f"{pmap.shard_shapes.get(ep)}.",
                hint="The model-states and optimizer files come from different runs, or one is damaged.",
            )
        spans += [(p.source, p.numel, ep, p.dest) for p in pmap.pieces.get(ep, ())]
    spans.sort()
    at = 0
    for start, numel, _, _ in spans:
        if start != at:
            break
        at += numel
    if at != total or len({ep for _, _, ep, _ in spans}) != len(shards):
        raise UnsupportedCheckpointError(
            f"{pmap.name}: the AutoEP affine map's pieces do not cover its {total:,} elements exactly once.",
            hint="The model-states file is damaged or was not written by DeepSpeed's AutoEP.",
        )
    first = next(iter(shards.values()))
    segs = _join(spans, {ep: t.segments for ep, t in shards.items()})
    names = [m for m, _ in first.moments]
    moments: tuple[tuple[str, tuple[Segment, ...]], ...] = ()
    if names and all([m for m, _ in t.moments] == names for t in shards.values()):
        moments = tuple(
            (m, _join(spans, {ep: dict(t.moments)[m] for ep, t in shards.items()})) for m in names
        )
    return replace(first, shape=pmap.logical_shape, segments=segs, moments=moments, group=group)


def _join(
    spans: Sequence[tuple[int, int, int, int]], by_ep: Mapping[int, tuple[Segment, ...]]
) -> tuple[Segment, ...]:
    out: list[Segment] = []
    for _, numel, ep, dest in spans:
        out += cut(by_ep[ep], dest, numel)
    return tuple(out)


def cut(segs: Sequence[Segment], start: int, numel: int) -> list[Segment]:
    """Elements [start, start+numel) of the tensor that `segs` concatenate to, as segments."""
    out: list[Segment] = []
    pos = 0
    for s in segs:
        lo, hi = max(start, pos), min(start + numel, pos + s.numel)
        if lo < hi:
            item = s.nbytes // s.numel if s.numel else 0
            out.append(Segment(s.file, s.offset + (lo - pos) * item, hi - lo, s.dtype))
        pos += s.numel
    if sum(s.numel for s in out) != numel:
        raise UnsupportedCheckpointError(
            "An AutoEP affine-map piece reaches past its shard.",
            hint="The model-states file is damaged or was not written by DeepSpeed's AutoEP.",
        )
    return out


def holding(
    module: str, placement: Mapping[int, Sequence[int]], by_ep: Mapping[int, Sequence[int]]
) -> Holding:
    """One AutoEP layer's row: each expert-parallel rank's global experts (AutoEP may place them apart) and the
    ranks (its expert-data-parallel group) that hold them."""
    return Holding(
        module,
        tuple(
            ExpertSpan(tuple(sorted(placement[ep])), tuple(sorted(by_ep.get(ep, ()))))
            for ep in sorted(placement)
        ),
    )
