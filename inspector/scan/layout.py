"""Where each trainable parameter's fp32 master (and Adam moments) lives across rank files.

Stage 1/2 (FORMAT.md §3.2): each group is one flat buffer split into equal partitions of P elements, rank r
owning [r·P, (r+1)·P); `param_shapes[g]` gives the buffer order, with `param_alignment_paddings` after each
parameter. Stage 3 (§3.4): every parameter is split into ws slices of ceil(numel/ws) elements and each rank
concatenates its slices per sub-group. Pure arithmetic on metadata; the results are `Segment`s.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from inspector.errors import CorruptFileError
from inspector.format.torchzip import TensorRef
from inspector.parse.states import MOMENTS, OptimStates, Shape
from inspector.scan.model import Finding, GroupInfo, Kind, RankGroup, Segment, Severity, TensorInfo
from inspector.scan.slices import RankSlices, RankStarts
from inspector.system.units import plural

ParamShapes = tuple[tuple[tuple[str, Shape], ...], ...]


@dataclass
class Layout:
    """Trainable tensors plus per-group and per-rank partition facts, and what looked wrong."""

    params: dict[str, TensorInfo] = field(default_factory=dict)
    groups: tuple[GroupInfo, ...] = ()
    rank_groups: list[tuple[RankGroup, ...]] = field(default_factory=list)
    master_dtype: str = "float32"
    findings: list[Finding] = field(default_factory=list)


def _numel(shape: Sequence[int]) -> int:
    return math.prod(shape)


def _ceil(a: int, b: int) -> int:
    return -(-a // b)


def _ref(value: TensorRef, what: str, path: str) -> TensorRef:
    if not value.is_contiguous():  # flat buffers are sliced by byte offset below, so they must be dense
        raise CorruptFileError(
            f"{path}: {what} is not a dense tensor (shape {value.shape}, strides {value.stride}).",
            hint="DeepSpeed saves flat partitions as dense 1-D tensors; the file is damaged or crafted.",
        )
    return value


def _groups_of(states: Sequence[OptimStates], n: int) -> None:
    """Every rank file has one state per group of param_shapes."""
    for st in states:
        if len(st.groups) != n:
            raise CorruptFileError(
                f"{st.file}: {len(st.groups)} optimizer groups, param_shapes has {n}.",
                hint="Model and optimizer files come from different runs, or the file is damaged.",
            )


def split_flat(off: int, numel: int, part: int, refs: Sequence[TensorRef]) -> tuple[Segment, ...]:
    """Segments for elements [off, off+numel) of a flat buffer cut into `part`-sized rank partitions."""
    segs = []
    end = off + numel
    r = off // part if part else 0
    while off < end:
        hi = min(end, (r + 1) * part)
        ref = refs[r]
        local = off - r * part
        segs.append(Segment(ref.path, ref.offset + local * ref.itemsize, hi - off, ref.dtype))
        off = hi
        r += 1
    return tuple(segs)


def stage12_layout(param_shapes: ParamShapes, states: Sequence[OptimStates]) -> Layout:
    """Stage 1/2 and BF16_Optimizer: rebuild from `param_shapes`, never from `param_slice_mappings` (§3.2);
    the mappings only prove which rank wrote which file (`_check_slices`)."""
    lay = Layout()
    rank_groups: list[list[RankGroup]] = [[] for _ in states]
    _groups_of(states, len(param_shapes))
    lay.groups = tuple(
        _stage12_group(lay, g, shapes, states, rank_groups) for g, shapes in enumerate(param_shapes)
    )
    lay.rank_groups = [tuple(rg) for rg in rank_groups]
    return lay


def _stage12_group(
    lay: Layout,
    g: int,
    shapes: tuple[tuple[str, Shape], ...],
    states: Sequence[OptimStates],
    rank_groups: list[list[RankGroup]],
) -> GroupInfo:
    """One flat group: its partition size checked, each rank's share recorded, its parameters placed."""
    ws, paths = len(states), [st.file for st in states]
    names = [n for n, _ in shapes]
    numels = [_numel(s) for _, s in shapes]
    g0 = states[0].groups[g]
    pads = _paddings(lay, g, g0.alignment, len(names), paths[0])
    raw = sum(numels) + sum(pads)
    w = g0.partition_count
    if w is not None and w != ws:
        lay.findings.append(
            Finding(
                Severity.ERROR,
                "partition-count",
                f"Group {g} was partitioned over {plural(w, 'rank')} but there are {plural(ws, 'optimizer file')}.",
                paths[0],
                "Rank files are missing or come from another run.",
            )
        )
    refs = [_ref(st.groups[g].master, f"fp32 partition of group {g}", st.file) for st in states]
    moments = [st.groups[g].moments for st in states]
    part = _partition(lay, g, raw, states, refs, moments)
    for r, ref in enumerate(refs):
        need = min(part, max(0, raw - r * part))
        if ref.numel < need or ref.numel > part:
            raise CorruptFileError(
                f"{paths[r]}: group {g} partition has {ref.numel} elements; expected {need}..{part}.",
                hint="Files from different runs are mixed, or the file is damaged.",
            )
        pad = states[r].groups[g].padding
        gaps = _overlap(alignment_spans(numels, pads), r * part, (r + 1) * part)
        rank_groups[r].append(RankGroup(g, part, ref.numel, part - need if pad is None else pad, gaps))
    if refs[0].dtype != "float32":
        lay.master_dtype = refs[0].dtype
    have_moments = all(
        m is not None and all(t.numel >= min(part, max(0, raw - r * part)) for t in m.values())
        for r, m in enumerate(moments)
    )
    off = 0
    for (name, shape), n, pad in zip(shapes, numels, pads, strict=True):
        segs = split_flat(off, n, part, refs)
        mom: tuple[tuple[str, tuple[Segment, ...]], ...] = ()
        if have_moments:
            mom = tuple((m, split_flat(off, n, part, [mm[m] for mm in moments if mm])) for m in MOMENTS)
        lay.params[name] = TensorInfo(
            name, shape, refs[0].dtype, Kind.TRAINABLE, segs, group=g, moments=mom, pad_after=pad
        )
        off += n + pad
    lay.findings += _check_slices(g, dict(zip(names, numels, strict=True)), part, states)
    return GroupInfo(g, len(names), sum(numels), part * ws, part, g0.hyperparams, sum(pads))


def _paddings(lay: Layout, g: int, alignment: Sequence[int] | None, n: int, path: str) -> list[int]:
    """The padding after each of a group's `n` parameters (none recorded: none); a count that does not match
    the parameters is an error finding, and the group is read unpadded."""
    pads = list(alignment) if alignment is not None else [0] * n
    if len(pads) != n:
        lay.findings.append(
            Finding(
                Severity.ERROR,
                "alignment",
                f"Group {g}: {len(pads)} alignment paddings for {n} parameters.",
                path,
            )
        )
        pads = [0] * n
    return pads


def _partition(
    lay: Layout,
    g: int,
    raw: int,
    states: Sequence[OptimStates],
    refs: Sequence[TensorRef],
    moments: Sequence[Mapping[str, TensorRef] | None],
) -> int:
    """Elements per rank in group `g` (what the moments or the masters hold), checked against DeepSpeed's
    formula; a size that cannot hold the group's `raw` elements is corrupt."""
    ws = len(states)
    trimmed = states[0].zero_stage is not None  # BF16_Optimizer keeps full partitions
    align = 2 * ws
    formula = _ceil(raw, align) * align // ws
    m0 = moments[0]
    part: int = m0["exp_avg"].numel if m0 else (refs[0].numel if not trimmed else formula)
    if part != formula:
        lay.findings.append(
            Finding(
                Severity.WARNING,
                "partition-size",
                f"Group {g}: partitions hold {part} elements; the DeepSpeed formula gives {formula}.",
                states[0].file,
            )
        )
    if part * ws < raw or part <= 0:
        raise CorruptFileError(
            f"Group {g}: {ws} partitions of {part} elements cannot hold {raw} elements.",
            hint="Rank files are missing or come from another run.",
        )
    return part


def alignment_spans(numels: Sequence[int], pads: Sequence[int]) -> list[tuple[int, int]]:
    """[start, end) of each run of alignment padding in a flat group (after each parameter, §3.2)."""
    spans, off = [], 0
    for n, pad in zip(numels, pads, strict=True):
        off += n
        if pad:
            spans.append((off, off + pad))
        off += pad
    return spans


def _overlap(spans: Sequence[tuple[int, int]], lo: int, hi: int) -> int:
    return sum(max(0, min(e, hi) - max(s, lo)) for s, e in spans)


def _contiguous(frags: list[tuple[int, int, int]], numel: int, part: int) -> bool:
    """Whether (rank, start, numel) fragments in rank order make up one whole parameter of `numel`."""
    if not frags:
        return numel == 0
    ranks = [r for r, _, _ in frags]
    if sum(k for _, _, k in frags) != numel or ranks != list(range(ranks[0], ranks[0] + len(ranks))):
        return False
    last = len(frags) - 1
    return all(
        start + k <= part and (i == 0 or start == 0) and (i == last or start + k == part)
        for i, (_, start, k) in enumerate(frags)
    )


def _check_slices(g: int, numels: dict[str, int], part: int, states: Sequence[OptimStates]) -> list[Finding]:
    """Prove which rank wrote which file from `param_slice_mappings` (stage 1/2, BF16_Optimizer).

    Whatever order DeepSpeed listed them in (its round-robin bug included, §3.2), the fragments of one
    parameter taken in rank order concatenate to the whole parameter: ranks consecutive, every fragment but
    the first starting at its partition's start, every one but the last running to its partition's end. A
    rank file copied or renamed into another rank's place breaks that, though shapes and sizes all agree."""
    maps = [st.groups[g].slices for st in states]
    if len(states) < 2 or any(m is None for m in maps):
        return []
    frags: dict[str, list[tuple[int, int, int]]] = {}
    for r, m in enumerate(maps):
        for name, start, numel in m or ():
            if numel:
                frags.setdefault(name, []).append((r, start, numel))
    bad = [name for name, n in numels.items() if not _contiguous(frags.get(name, []), n, part)]
    if not bad:
        return []
    return [
        Finding(
            Severity.ERROR,
            "rank-mismatch",
            f"Group {g}: the optimizer files' own fragment maps (param_slice_mappings) do not fit their rank "
            f"positions for {len(bad)} parameter(s) (e.g. {bad[0]}): a rank file was copied or renamed into "
            "another rank's place, so the rebuilt values would be wrong.",
            states[0].file,
            "Restore every *_optim_states.pt from the save that wrote it; rank files cannot stand in for "
            "each other.",
        )
    ]


def stage3_layout(param_shapes: ParamShapes, states: Sequence[OptimStates]) -> Layout:
    """Stage 3: rank r holds elements [r·p, (r+1)·p) of every parameter, p = ceil(numel/ws) (§3.4)."""
    lay = Layout()
    ws = len(states)
    paths = [st.file for st in states]
    count = states[0].partition_count
    if count is not None and count != ws:
        lay.findings.append(
            Finding(
                Severity.ERROR,
                "partition-count",
                f"Parameters were partitioned over {plural(count, 'rank')} but there are {plural(ws, 'optimizer file')}.",
                paths[0],
                "Rank files are missing or come from another run.",
            )
        )
    _groups_of(states, len(param_shapes))
    groups = []
    rank_groups: list[list[RankGroup]] = [[] for _ in range(ws)]
    for g, shapes in enumerate(param_shapes):
        numels = [_numel(s) for _, s in shapes]
        parts = [_ceil(n, ws) for n in numels]
        total = sum(parts)
        refs = [_ref(st.groups[g].master, f"fp32 flat group {g}", st.file) for st in states]
        held = _held(numels, parts, ws)
        for r, ref in enumerate(refs):
            if ref.numel != total or ref.dtype != refs[0].dtype:
                raise CorruptFileError(
                    f"{paths[r]}: sub-group {g} holds {ref.numel} elements of {ref.dtype}; the parameter "
                    f"shapes need {total} (of {refs[0].dtype}, as rank 0 holds).",
                    hint="Files from different runs are mixed, or the file is damaged.",
                )
            rank_groups[r].append(RankGroup(g, total, total, total - held[r]))
        if refs[0].dtype != "float32":
            lay.master_dtype = refs[0].dtype
        moments = [st.groups[g].moments for st in states]
        have_moments = all(m is not None and all(t.numel == total for t in m.values()) for m in moments)
        have_moments = have_moments and all(len({mm[m].dtype for mm in moments if mm}) == 1 for m in MOMENTS)
        starts = _starts(refs)
        mom_starts = [(m, _starts([mm[m] for mm in moments if mm])) for m in MOMENTS] if have_moments else []
        off = 0
        for (name, shape), n, p in zip(shapes, numels, parts, strict=True):
            # one small record per copy: the segments are computed from the partition rule when read
            segs: Any = RankSlices(starts, off, n, p)
            mom = tuple((m, RankSlices(st, off, n, p)) for m, st in mom_starts)
            lay.params[name] = TensorInfo(
                name, shape, refs[0].dtype, Kind.TRAINABLE, segs, group=g, moments=mom  # type: ignore[arg-type]
            )
            off += p
        groups.append(
            GroupInfo(g, len(numels), sum(numels), total * ws, total, states[0].groups[g].hyperparams)
        )
    lay.groups = tuple(groups)
    lay.rank_groups = [tuple(rg) for rg in rank_groups]
    return lay


def _held(numels: Sequence[int], parts: Sequence[int], ws: int) -> list[int]:
    """Elements of parameters (not padding) each rank holds in a sub-group: a parameter gives its `p` to the
    ranks before numel // p and the rest to the one at it. Linear in ranks plus parameters, not their product."""
    step = [0] * (ws + 1)
    for n, p in zip(numels, parts, strict=True):
        full = min(n // p, ws) if p else 0
        step[0] += p
        step[full] -= p
        if full < ws and n - full * p > 0:
            step[full] += n - full * p
            step[full + 1] -= n - full * p
    held, run = [], 0
    for r in range(ws):
        run += step[r]
        held.append(run)
    return held


def _starts(refs: Sequence[TensorRef]) -> RankStarts:
    """Each rank's flat tensor as (file, byte offset of element 0), one record per sub-group and copy shared
    by all its parameters."""
    return RankStarts([ref.path for ref in refs], [ref.offset for ref in refs], refs[0].dtype)
