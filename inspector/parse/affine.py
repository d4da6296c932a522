"""How a tensor-parallel parameter is laid over its shards, as one typed value whatever record said it
(FORMAT.md §4.2): `universal_checkpoint_info.affine_map` (DeepSpeed's `checkpoint/affine.py`, format 1) and
the category lists alike become a `Layout`, a set of blocks per shard, so two records about one parameter
are compared as values, never chosen between.

A block is what DeepSpeed's map builders write (`replicated_map`, `contiguous_split_map`, `sub_param_map`,
`segmented_map`, `block_gather_map`): a row-major box of the logical tensor held as a row-major box of a
shard, times a `scale` (`shard == full * scale`). A piece whose strides are not its tensor's own (a
transposed or overlapping view) is refused here rather than read: no DeepSpeed builder writes one.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from inspector.parse.tree import MAX_DIMS, Node

Shape = tuple[int, ...]
MAX_RANKS = 1 << 16
MAX_PIECES = 4096  # pieces of one parameter over all ranks (a replicated one: one per rank)
MAX_BLOCKS = 256  # distinct blocks of one parameter (checked pairwise): tp 64 x 3 fused sub-parameters is 192


@dataclass(frozen=True, order=True)
class Block:
    """Elements `start`..`start+shape` of the logical tensor, held at `at` in shard `rank`, times `scale`."""

    start: Shape
    shape: Shape
    rank: int
    at: Shape
    scale: float = 1.0

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


@dataclass(frozen=True)
class Layout:
    """One parameter's full shape, each shard's shape and the blocks that rebuild it; `source` names the
    record it was read from (`affine_map`, `tp_replicated_parameter_patterns`, ...), for messages."""

    logical: Shape
    shards: tuple[Shape, ...]  # by tensor-parallel rank
    blocks: tuple[Block, ...]
    source: str

    @property
    def split_dims(self) -> tuple[int, ...]:
        """The dims some shard holds less of than the whole (none: every shard a full replica); the words of
        the app's detail and of the proposed TP selections both come from it."""
        return tuple(sorted({d for sh in self.shards for d, n in enumerate(sh) if n != self.logical[d]}))

    @property
    def scaled(self) -> tuple[float, ...]:
        """The scales other than 1 its blocks record (DeepSpeed divides the weights by them)."""
        return tuple(sorted({b.scale for b in self.blocks if b.scale != 1.0}))

    def same_as(self, other: Layout) -> bool:
        """Whether both put every element in the same place: same shapes, same blocks on the same shards."""
        return (self.logical, self.shards) == (other.logical, other.shards) and _canon(self) == _canon(other)


def _canon(layout: Layout) -> tuple[tuple[Shape, Shape, int, Shape], ...]:
    """The blocks' geometry (their scales are checked on their own: `Layout.scaled`)."""
    return tuple(sorted({(b.start, b.shape, b.rank, b.at) for b in layout.blocks}))


def row_major(shape: Shape) -> Shape:
    out, step = [], 1
    for d in reversed(shape):
        out.append(step)
        step *= d
    return tuple(reversed(out))


def _unravel(offset: int, shape: Shape) -> Shape:
    out = []
    for stride in row_major(shape):
        q, offset = divmod(offset, stride) if stride else (0, offset)
        out.append(q)
    return tuple(out)


def parse_map(node: Node) -> Layout:
    """One `affine_map.params[pattern]` entry (`ParamAffineMap.to_dict()`), checked: ranks 0..n-1, pieces that
    are boxes of both tensors, per-rank element counts as `validate()` checks them, and full coverage (the
    scan compares n with the shards present)."""
    logical = node.at("logical_shape").shape()
    ranks = node.at("ranks")
    held: dict[int, tuple[Shape, Node]] = {}
    for key, r in ranks.items_any():
        rank = Node(key, node.file, r.path).integer(0, MAX_RANKS)
        held[rank] = (r.at("shard_shape").shape(), r.at("pieces"))
    tp = len(held)
    if sorted(held) != list(range(tp)):
        raise ranks.fail(f"describes ranks {sorted(held)[:8]}, not ranks 0 to {tp - 1}")
    blocks: list[Block] = []
    for rank in range(tp):
        shard, pieces = held[rank]
        mine = [_piece(p, rank, logical, shard) for p in pieces.seq(MAX_PIECES)]
        if sum(b.numel for b in mine) != math.prod(shard):
            raise pieces.fail(f"account for {sum(b.numel for b in mine):,} elements of a shard of {shard}")
        blocks += [b for b in mine if b.numel]
        if len(blocks) > MAX_PIECES:
            raise ranks.fail(f"holds more than {MAX_PIECES:,} pieces")
    layout = Layout(logical, tuple(held[t][0] for t in range(tp)), tuple(blocks), "affine_map")
    problem = tiling_problem(layout)
    if problem:
        raise node.fail(problem)
    return layout


def _piece(p: Node, rank: int, logical: Shape, shard: Shape) -> Block:
    shape = p.at("shape").shape()
    corners = []
    for side, whole in (("source", logical), ("dest", shard)):
        node = p.at(side)
        parts = node.seq(2)
        if len(parts) != 2:
            raise node.fail("is not [offset, strides]")
        offset = parts[0].integer(0, None)
        strides = tuple(s.integer(0, None) for s in parts[1].seq(MAX_DIMS))
        want = row_major(whole)
        start = _unravel(offset, whole) if math.prod(whole) else tuple(0 for _ in whole)
        if (
            len(shape) != len(whole)
            or len(strides) != len(whole)
            or any(n > 1 and s != w for n, s, w in zip(shape, strides, want, strict=True))
            or any(a + n > d for a, n, d in zip(start, shape, whole, strict=True))
        ):
            raise node.fail(
                f"is not a block of the {side} tensor {whole} (a strided or out-of-bounds piece: no DeepSpeed "
                "map builder writes one, and it is not read)"
            )
        corners.append(start)
    locations = {x.integer(0, MAX_RANKS) for x in p.at("locations").seq(MAX_RANKS)}
    if rank not in locations:
        raise p.at("locations").fail(f"does not name rank {rank}, whose shard lists the piece")
    scale = 1.0 if p.at("scale").is_none() else p.at("scale").number()
    if scale == 0.0 or scale != scale or abs(scale) == float("inf"):
        raise p.at("scale").fail("is not a finite, non-zero factor (DeepSpeed refuses it too)")
    return Block(corners[0], shape, rank, corners[1], scale)


def tiling_problem(layout: Layout) -> str | None:
    """Why the blocks do not rebuild the tensor exactly once (replicas of a block count once), if not."""
    distinct: dict[tuple[Shape, Shape], float] = {}
    for b in layout.blocks:
        if len(b.start) != len(layout.logical):
            return f"a piece has {len(b.start)} dims, the tensor {len(layout.logical)}"
        if distinct.setdefault((b.start, b.shape), b.scale) != b.scale:
            return f"the copies of the block at {list(b.start)} record different scales"
    boxes = list(distinct)
    if len(boxes) > MAX_BLOCKS:
        return (
            f"it has {len(boxes):,} distinct pieces, more than {MAX_BLOCKS} (no tensor-parallel layout has)"
        )
    if sum(math.prod(s) for _, s in boxes) != math.prod(layout.logical):
        return f"its pieces do not cover the {math.prod(layout.logical):,} elements of {layout.logical} once"
    for i, (a, sa) in enumerate(boxes):
        for c, sc in boxes[i + 1 :]:
            if all(x < y + m and y < x + n for x, n, y, m in zip(a, sa, c, sc, strict=True)):
                return f"pieces at {list(a)} and {list(c)} overlap"
    return None


def split(shards: list[Shape], dim: int, source: str) -> Layout:
    """Shard t is the t-th block along `dim` (`torch.cat(slices, dim)`; `contiguous_split_map`)."""
    s0 = shards[0]
    logical = (*s0[:dim], sum(s[dim] for s in shards), *s0[dim + 1 :])
    blocks, pos = [], 0
    for t, s in enumerate(shards):
        start = tuple(pos if d == dim else 0 for d in range(len(s0)))
        blocks.append(Block(start, s, t, tuple(0 for _ in s)))
        pos += s[dim]
    return Layout(logical, tuple(shards), tuple(b for b in blocks if b.numel), source)


def replicated(shards: list[Shape], source: str) -> Layout:
    """Every shard holds the whole tensor (`replicated_map`)."""
    zero = tuple(0 for _ in shards[0])
    blocks = tuple(Block(zero, s, t, zero) for t, s in enumerate(shards) if math.prod(s))
    return Layout(shards[0], tuple(shards), blocks, source)


def sub_params(shards: list[Shape], dim: int, widths: tuple[tuple[int, ...], ...], source: str) -> Layout:
    """Sub-parameter i's rows along `dim` are widths[i][t] on shard t, sub-parameters one after another on
    every shard and in the full tensor (`sub_param_map`, `merge_tp_slices`' sub-parameter branch)."""
    s0 = shards[0]
    logical = (*s0[:dim], sum(sum(w) for w in widths), *s0[dim + 1 :])
    blocks, src, dst = [], 0, [0] * len(shards)
    for w in widths:
        for t, s in enumerate(shards):
            shape = tuple(w[t] if d == dim else n for d, n in enumerate(s))
            start = tuple(src if d == dim else 0 for d in range(len(s)))
            at = tuple(dst[t] if d == dim else 0 for d in range(len(s)))
            blocks.append(Block(start, shape, t, at))
            src += w[t]
            dst[t] += w[t]
    return Layout(logical, tuple(shards), tuple(b for b in blocks if b.numel), source)


def cut_rows(layout: Layout, keep: int) -> Layout:
    """The first `keep` rows only (a vocabulary's padding cut: `param[:original_vocab_size]`)."""
    blocks = []
    for b in layout.blocks:
        rows = min(b.start[0] + b.shape[0], keep) - b.start[0]
        if rows > 0:
            blocks.append(Block(b.start, (rows, *b.shape[1:]), b.rank, b.at, b.scale))
    return Layout((keep, *layout.logical[1:]), layout.shards, tuple(blocks), layout.source)
