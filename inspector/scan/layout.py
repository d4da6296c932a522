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
from inspector.scan.model import Finding, GroupInfo, Kind, RankGroup, Segment, Severity, TensorInfo

MOMENTS = ("exp_avg", "exp_avg_sq")


@dataclass
class Layout:
    """Trainable tensors plus per-group and per-rank partition facts, and what looked wrong."""

    params: dict[str, TensorInfo] = field(default_factory=dict)
    groups: tuple[GroupInfo, ...] = ()
    rank_groups: list[tuple[RankGroup, ...]] = field(default_factory=list)
    master_dtype: str = "float32"
    findings: list[Finding] = field(default_factory=list)


def _numel(shape: Sequence[int]) -> int:
    return math.prod(int(d) for d in shape)


def _per_rank(osds: Sequence[Mapping[str, Any]], key: str, groups: int, paths: Sequence[str]) -> list[Any]:
    """Each rank's per-group list under `key`, checked to have one entry per group of param_shapes."""
    lists = [osd.get(key) for osd in osds]
    for r, lst in enumerate(lists):
        if not isinstance(lst, list) or len(lst) != groups:
            raise CorruptFileError(
                f"{paths[r]}: {key} has {len(lst) if isinstance(lst, list) else 'no'} groups, param_shapes has "
                f"{groups}.",
                hint="Model and optimizer files come from different runs, or the file is damaged.",
            )
    return lists


def _ceil(a: int, b: int) -> int:
    return -(-a // b)


def _ref(value: Any, what: str, path: str) -> TensorRef:
    if not isinstance(value, TensorRef):
        raise CorruptFileError(
            f"{path}: {what} is missing or not a tensor.",
            hint="The optimizer file is damaged or from an unsupported DeepSpeed version.",
        )
    if not value.is_contiguous():  # flat buffers are sliced by byte offset below, so they must be dense
        raise CorruptFileError(
            f"{path}: {what} is not a dense tensor (shape {value.shape}, strides {value.stride}).",
            hint="DeepSpeed saves flat partitions as dense 1-D tensors; the file is damaged or crafted.",
        )
    return value


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


def _group_moments(osd: Mapping[str, Any], g: int, stage3: bool) -> dict[str, TensorRef] | None:
    base = osd.get("optimizer_state_dict" if stage3 else "base_optimizer_state")
    if not isinstance(base, dict):
        return None  # elastic (list) layout of DeepSpeed <= 0.5.9: moments trimmed per group; not mapped
    state = base.get("state") or {}
    key: Any = g
    if not stage3:
        groups = base.get("param_groups") or []
        if g < len(groups) and groups[g].get("params"):
            key = groups[g]["params"][0]
    st = state.get(key)
    if not isinstance(st, dict):
        return None
    out = {m: st[m] for m in MOMENTS if isinstance(st.get(m), TensorRef) and st[m].is_contiguous()}
    return out if len(out) == len(MOMENTS) else None


def _hyperparams(osd: Mapping[str, Any], g: int, stage3: bool) -> dict[str, Any]:
    base = osd.get("optimizer_state_dict" if stage3 else "base_optimizer_state")
    groups = base.get("param_groups") if isinstance(base, dict) else None
    if not groups:
        return {}
    if stage3:
        group = next((pg for pg in groups if g in (pg.get("params") or [])), None)
    else:
        group = groups[g] if g < len(groups) else None
    keep = ("lr", "weight_decay", "betas", "eps", "momentum", "name")
    return {k: v for k, v in (group or {}).items() if k in keep}


def stage12_layout(
    param_shapes: Sequence[Mapping[str, Any]], osds: Sequence[Mapping[str, Any]], paths: Sequence[str]
) -> Layout:
    """Stage 1/2 and BF16_Optimizer: rebuild from `param_shapes`, never from `param_slice_mappings` (§3.2)."""
    lay = Layout()
    ws = len(osds)
    osd0 = osds[0]
    trimmed = "zero_stage" in osd0  # BF16_Optimizer keeps full partitions
    counts = osd0.get("partition_count")
    groups = []
    rank_groups: list[list[RankGroup]] = [[] for _ in range(ws)]
    fp32_lists = _per_rank(osds, "single_partition_of_fp32_groups", len(param_shapes), paths)
    for g, shapes in enumerate(param_shapes):
        names = list(shapes)
        numels = [_numel(s) for s in shapes.values()]
        pads_all = osd0.get("param_alignment_paddings")
        pads = list(pads_all[g]) if isinstance(pads_all, list) and g < len(pads_all) else [0] * len(names)
        if len(pads) != len(names):
            lay.findings.append(
                Finding(
                    Severity.ERROR,
                    "alignment",
                    f"Group {g}: {len(pads)} alignment paddings for {len(names)} parameters.",
                    paths[0],
                )
            )
            pads = [0] * len(names)
        raw = sum(numels) + sum(pads)
        w = counts[g] if isinstance(counts, list) and g < len(counts) else counts
        if isinstance(w, int) and w != ws:
            lay.findings.append(
                Finding(
                    Severity.ERROR,
                    "partition-count",
                    f"Group {g} was partitioned over {w} ranks but there are {ws} optimizer files.",
                    paths[0],
                    "Rank files are missing or come from another run.",
                )
            )
        refs = [_ref(fp32_lists[r][g], f"fp32 partition of group {g}", paths[r]) for r in range(ws)]
        moments = [_group_moments(osd, g, False) for osd in osds]
        align = 2 * ws
        formula = _ceil(raw, align) * align // ws
        part = moments[0]["exp_avg"].numel if moments[0] else (refs[0].numel if not trimmed else formula)
        if part != formula:
            lay.findings.append(
                Finding(
                    Severity.WARNING,
                    "partition-size",
                    f"Group {g}: partitions hold {part} elements; the DeepSpeed formula gives {formula}.",
                    paths[0],
                )
            )
        if part * ws < raw:
            raise CorruptFileError(
                f"Group {g}: {ws} partitions of {part} elements cannot hold {raw} elements.",
                hint="Rank files are missing or come from another run.",
            )
        for r, ref in enumerate(refs):
            need = min(part, max(0, raw - r * part))
            if ref.numel < need or ref.numel > part:
                raise CorruptFileError(
                    f"{paths[r]}: group {g} partition has {ref.numel} elements; expected {need}..{part}.",
                    hint="Files from different runs are mixed, or the file is damaged.",
                )
            paddings = osds[r].get("group_paddings")
            pad = paddings[g] if isinstance(paddings, list) and g < len(paddings) else part - need
            rank_groups[r].append(RankGroup(g, part, ref.numel, int(pad)))
        if refs[0].dtype != "float32":
            lay.master_dtype = refs[0].dtype
        have_moments = all(
            m is not None and all(t.numel >= min(part, max(0, raw - r * part)) for t in m.values())
            for r, m in enumerate(moments)
        )
        off = 0
        for name, shape, n, pad in zip(names, shapes.values(), numels, pads, strict=True):
            segs = split_flat(off, n, part, refs)
            mom: tuple[tuple[str, tuple[Segment, ...]], ...] = ()
            if have_moments:
                mom = tuple((m, split_flat(off, n, part, [mm[m] for mm in moments if mm])) for m in MOMENTS)
            lay.params[name] = TensorInfo(
                name, tuple(int(d) for d in shape), refs[0].dtype, Kind.TRAINABLE, segs, group=g, moments=mom
            )
            off += n + pad
        groups.append(GroupInfo(g, len(names), sum(numels), part * ws, part, _hyperparams(osd0, g, False)))
    lay.groups = tuple(groups)
    lay.rank_groups = [tuple(rg) for rg in rank_groups]
    return lay


def stage3_layout(
    param_shapes: Sequence[Mapping[str, Any]], osds: Sequence[Mapping[str, Any]], paths: Sequence[str]
) -> Layout:
    """Stage 3: rank r holds elements [r·p, (r+1)·p) of every parameter, p = ceil(numel/ws) (§3.4)."""
    lay = Layout()
    ws = len(osds)
    count = osds[0].get("partition_count")
    if isinstance(count, int) and count != ws:
        lay.findings.append(
            Finding(
                Severity.ERROR,
                "partition-count",
                f"Parameters were partitioned over {count} ranks but there are {ws} optimizer files.",
                paths[0],
                "Rank files are missing or come from another run.",
            )
        )
    flats = _per_rank(osds, "fp32_flat_groups", len(param_shapes), paths)
    groups = []
    rank_groups: list[list[RankGroup]] = [[] for _ in range(ws)]
    for g, shapes in enumerate(param_shapes):
        numels = [_numel(s) for s in shapes.values()]
        parts = [_ceil(n, ws) for n in numels]
        total = sum(parts)
        refs = [_ref(flats[r][g], f"fp32 flat group {g}", paths[r]) for r in range(ws)]
        for r, ref in enumerate(refs):
            if ref.numel != total:
                raise CorruptFileError(
                    f"{paths[r]}: sub-group {g} holds {ref.numel} elements; the parameter "
                    f"shapes need {total}.",
                    hint="Files from different runs are mixed, or the file is damaged.",
                )
            stored = sum(max(0, min(p, n - r * p)) for n, p in zip(numels, parts, strict=True))
            rank_groups[r].append(RankGroup(g, total, total, total - stored))
        if refs[0].dtype != "float32":
            lay.master_dtype = refs[0].dtype
        moments = [_group_moments(osd, g, True) for osd in osds]
        have_moments = all(m is not None and all(t.numel == total for t in m.values()) for m in moments)
        off = 0
        for (name, shape), n, p in zip(shapes.items(), numels, parts, strict=True):
            segs = _rank_slices(refs, off, n, p)
            mom: tuple[tuple[str, tuple[Segment, ...]], ...] = ()
            if have_moments:
                mom = tuple((m, _rank_slices([mm[m] for mm in moments if mm], off, n, p)) for m in MOMENTS)
            lay.params[name] = TensorInfo(
                name, tuple(int(d) for d in shape), refs[0].dtype, Kind.TRAINABLE, segs, group=g, moments=mom
            )
            off += p
        groups.append(
            GroupInfo(g, len(numels), sum(numels), total * ws, total, _hyperparams(osds[0], g, True))
        )
    lay.groups = tuple(groups)
    lay.rank_groups = [tuple(rg) for rg in rank_groups]
    return lay


def _rank_slices(refs: Sequence[TensorRef], off: int, numel: int, part: int) -> tuple[Segment, ...]:
    segs = []
    for r, ref in enumerate(refs):
        take = min(part, numel - r * part)
        if take <= 0:
            break
        segs.append(Segment(ref.path, ref.offset + off * ref.itemsize, take, ref.dtype))
    return tuple(segs)
