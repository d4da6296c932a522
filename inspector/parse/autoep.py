"""DeepSpeed AutoEP's checkpoint records, typed: `ds_autoep_layers` in each rank's model states (expert
placement, affine maps, the ZeRO-3 partitioned-expert metadata) and `ds_zero_partition_groups` in each
stage-3 optimizer file (which ranks partition each sub-group). Read as DeepSpeed 0.19.8 writes them
(`engine._save_checkpoint`, `checkpoint/autoep_zero3_metadata.py`); anything else is refused here, at the
input boundary, with the field's path."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from inspector.parse.tree import Node

FORMAT_VERSION = 1  # AUTOEP_ZERO3_EXPERT_STATE_FORMAT_VERSION in DeepSpeed 0.19.8
_MAX = 1 << 20  # experts, ranks, pieces: far beyond any run, small enough to bound the work


@dataclass(frozen=True)
class Piece:
    """`numel` contiguous elements at `dest` in an expert-parallel rank's local shard that are elements
    [source, source+numel) of the logical (all-experts) tensor."""

    source: int
    dest: int
    numel: int


@dataclass(frozen=True)
class ParamMap:
    """One expert parameter's affine map: its logical shape and, per expert-parallel rank, its shard."""

    name: str
    logical_shape: tuple[int, ...]
    shard_shapes: dict[int, tuple[int, ...]]
    pieces: dict[int, tuple[Piece, ...]]


@dataclass(frozen=True)
class AutoEPLayer:
    """One `ds_autoep_layers` entry as one rank wrote it."""

    file: str
    layer_id: int  # moe_layer_id: the L of the per-expert files `layer_L_expert_K_…` (ZeRO-1/2)
    module_path: str
    num_experts: int
    ep_size: int
    expert_prefix: str
    placement: dict[int, tuple[int, ...]]  # expert-parallel rank -> global experts it holds
    params: tuple[ParamMap, ...]
    partitioned: bool  # checkpoint_format == "zero3_partitioned"
    ep_rank: int | None
    edp_rank: int | None
    edp_size: int | None


@dataclass(frozen=True)
class PartitionGroup:
    """`ds_zero_partition_groups[g]`: the ranks that partition stage-3 sub-group g, and this rank's place."""

    count: int
    rank: int
    ranks: tuple[int, ...]
    families: tuple[str, ...]


def autoep_layers(tree: Any, file: str) -> tuple[AutoEPLayer, ...] | None:
    """The model states' `ds_autoep_layers`; None when the run did not use AutoEP."""
    root = Node(tree, file)
    if not root.is_mapping() or root.at("ds_autoep_layers").is_none():
        return None
    return tuple(_layer(n, file) for n in root.at("ds_autoep_layers").seq(_MAX))


def partition_groups(tree: Any, file: str) -> tuple[PartitionGroup, ...] | None:
    """The optimizer file's `ds_zero_partition_groups`; None when absent (older DeepSpeed)."""
    root = Node(tree, file)
    osd = root.at("optimizer_state_dict") if root.is_mapping() else root
    node = osd.at("ds_zero_partition_groups") if osd.is_mapping() else Node(None, file)
    if node.is_none():
        return None
    out = []
    for g in node.seq(_MAX):
        ranks = tuple(r.integer(0, _MAX) for r in g.at("partition_ranks").seq(_MAX))
        count = g.at("partition_count").integer(1, _MAX)
        rank = g.at("partition_rank").integer(0, _MAX)
        if count != len(ranks) or rank >= count:
            raise g.fail(f"says {count} partitions and rank {rank}, but lists {len(ranks)} ranks")
        families = tuple(f.text(64) for f in g.at("families").seq(64))
        out.append(PartitionGroup(count, rank, ranks, families))
    return tuple(out)


def _layer(n: Node, file: str) -> AutoEPLayer:
    num = n.at("num_experts").integer(1, _MAX)
    ep = n.at("ep_size").integer(1, _MAX)
    placement = _placement(n.at("expert_placement"), num, ep)
    fmt = n.at("checkpoint_format")
    partitioned = not fmt.is_none() and fmt.text(64) == "zero3_partitioned"
    if partitioned:
        version = n.at("checkpoint_format_version")
        if version.integer(0, _MAX) != FORMAT_VERSION:
            raise version.fail(
                f"is an AutoEP ZeRO-3 format version this reader does not know (it reads {FORMAT_VERSION})"
            )
    maps = n.at("affine_maps").at("params")
    params = tuple(_param(name, m) for name, m in maps.entries("parameter name"))
    return AutoEPLayer(
        file=file,
        layer_id=n.at("moe_layer_id").integer(0, _MAX),
        module_path=n.at("module_path").name("module path"),
        num_experts=num,
        ep_size=ep,
        expert_prefix=n.at("expert_key_prefix").name("expert key prefix"),
        placement=placement,
        params=params,
        partitioned=partitioned,
        ep_rank=n.at("ep_rank").opt_integer(0, _MAX),
        edp_rank=n.at("expert_data_parallel_rank").opt_integer(0, _MAX),
        edp_size=n.at("expert_data_parallel_world_size").opt_integer(1, _MAX),
    )


def _placement(n: Node, num: int, ep: int) -> dict[int, tuple[int, ...]]:
    """Expert-parallel rank -> its global experts; every expert placed exactly once."""
    out: dict[int, tuple[int, ...]] = {}
    for r in n.at("ranks").seq(_MAX):
        rank = r.at("rank").integer(0, ep - 1)
        out[rank] = tuple(e.integer(0, num - 1) for e in r.at("experts").seq(num))
    placed = sorted(e for experts in out.values() for e in experts)
    if sorted(out) != list(range(ep)) or placed != list(range(num)):
        raise n.fail(f"does not place each of {num} experts on exactly one of {ep} expert-parallel ranks")
    return out


def _param(name: str, m: Node) -> ParamMap:
    logical = m.at("logical_shape").shape()
    total = math.prod(logical)
    shards: dict[int, tuple[int, ...]] = {}
    pieces: dict[int, tuple[Piece, ...]] = {}
    for key, r in m.at("ranks").items_any():
        rank = Node(key, m.file, r.path).integer(0, _MAX)
        shards[rank] = r.at("shard_shape").shape()
        pieces[rank] = tuple(_piece(p, total, math.prod(shards[rank])) for p in r.at("pieces").seq(_MAX))
    return ParamMap(name, logical, shards, pieces)


def _piece(p: Node, total: int, shard: int) -> Piece:
    """A piece whose source and destination are both dense row-major blocks (all DeepSpeed 0.19.8 writes
    for uniform and explicit placements); a strided piece is refused rather than guessed at."""
    shape = p.at("shape").shape()
    numel = math.prod(shape)
    ends = []
    for side, bound in (("source", total), ("dest", shard)):
        node = p.at(side)
        parts = node.seq(2)
        if len(parts) != 2:
            raise node.fail("is not [offset, strides]")
        offset = parts[0].integer(0, bound)
        strides = tuple(s.integer(0, None) for s in parts[1].seq(len(shape)))
        if not _dense(shape, strides) or offset + numel > bound:
            raise node.fail("is not a dense block inside its tensor (a strided AutoEP map is not supported)")
        ends.append(offset)
    scale = p.at("scale")
    if not scale.is_none() and scale.number() != 1.0:
        raise scale.fail(
            "is a scale other than 1 (shard = full x scale): DeepSpeed divides the weights by it and refuses "
            "the optimizer moments; it is refused here rather than the stored values written as the weights"
        )
    return Piece(ends[0], ends[1], numel)


def _dense(shape: tuple[int, ...], strides: tuple[int, ...]) -> bool:
    if len(strides) != len(shape):
        return False
    want = 1
    for dim, stride in zip(reversed(shape), reversed(strides), strict=True):
        if dim > 1 and stride != want:
            return False
        want *= dim
    return True
