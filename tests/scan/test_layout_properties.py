"""Property tests for the ZeRO layout arithmetic in inspector/zero.py against a naive reference.

The reference materialises each flat buffer as an array of labels (`param * 10_000 + element`, negative
for padding), cuts it into rank partitions exactly as FORMAT.md §3.2/§3.4 describe, and stores each
partition in a fake "file". Every Segment the layout code returns is then decoded back to labels, which
must be precisely the parameter's elements in order.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from inspector.errors import CorruptFileError
from inspector.format.dtypes import itemsize
from inspector.format.views import StorageRef, TensorRef
from inspector.parse.states import ModelStates, OptimStates
from inspector.scan.layout import Layout, split_flat, stage3_layout, stage12_layout
from inspector.scan.model import Segment, Severity

SETTINGS = settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
PAD, TAIL = -1, -2


def _records(param_shapes: Any, osds: Any, paths: Any, stage3: bool) -> tuple[Any, list[OptimStates]]:
    """The raw trees a test built, through the input boundary's parser, as the scan sees them."""
    shapes = ModelStates.parse({"module": {}, "param_shapes": param_shapes}, "model.pt").param_shapes
    states = [OptimStates.parse({"optimizer_state_dict": o}, p, stage3) for o, p in zip(osds, paths, strict=True)]
    return shapes, states


def stage12(param_shapes: Any, osds: Any, paths: Any) -> Layout:
    return stage12_layout(*_records(param_shapes, osds, paths, False))


def stage3(param_shapes: Any, osds: Any, paths: Any) -> Layout:
    return stage3_layout(*_records(param_shapes, osds, paths, True))


@dataclass
class Files:
    """Fake files: each holds one labelled array at a byte offset; Segments decode back to labels."""

    arrays: dict[str, tuple[int, np.ndarray]] = field(default_factory=dict)

    def ref(
        self, path: str, labels: np.ndarray, base: int, lead: int = 0, dtype: str = "float32"
    ) -> TensorRef:
        """A 1-D TensorRef over `labels`, stored after `lead` unrelated elements at byte `base`."""
        size = itemsize(dtype)
        self.arrays[path] = (base + lead * size, labels)
        storage = StorageRef(path, "0", dtype, base, (lead + len(labels)) * size)
        return TensorRef(storage, lead, (len(labels),), (1,), dtype)

    def decode(self, segments: Sequence[Segment]) -> np.ndarray:
        out = []
        for s in segments:
            start, labels = self.arrays[s.file]
            size = itemsize(s.dtype)
            assert (s.offset - start) % size == 0
            i = (s.offset - start) // size
            assert i >= 0 and i + s.numel <= len(labels), "segment outside its partition"
            assert s.numel > 0, "empty segment"
            out.append(labels[i : i + s.numel])
        return np.concatenate(out) if out else np.zeros(0, dtype=np.int64)


def want(param: int, numel: int) -> np.ndarray:
    """The labels of a parameter's elements: `param * 10_000 + element`."""
    return param * 10_000 + np.arange(numel, dtype=np.int64)


# --- split_flat ------------------------------------------------------------------------------------------------


@st.composite
def flat_cases(draw: st.DrawFn) -> tuple[int, int, int, int]:
    ws = draw(st.integers(1, 9))
    part = draw(st.integers(1, 40))
    total = ws * part
    off = draw(st.integers(0, total))
    numel = draw(st.integers(0, total - off))
    return ws, part, off, numel


@SETTINGS
@given(
    flat_cases(),
    st.lists(st.integers(0, 50), min_size=9, max_size=9),
    st.sampled_from(["float32", "bfloat16"]),
)
@example((8, 1, 0, 8), [0] * 9, "float32")  # one element per rank, spans every rank
@example((3, 5, 4, 2), [0] * 9, "float32")  # crosses a single boundary
def test_split_flat_matches_naive_buffer(
    case: tuple[int, int, int, int], leads: list[int], dtype: str
) -> None:
    """Elements [off, off+numel) of a flat buffer cut into `part`-sized rank partitions."""
    ws, part, off, numel = case
    files = Files()
    flat = np.arange(ws * part, dtype=np.int64)
    refs = [
        files.ref(f"rank{r}", flat[r * part : (r + 1) * part], base=64 * r * 1000, lead=leads[r], dtype=dtype)
        for r in range(ws)
    ]
    segs = split_flat(off, numel, part, refs)
    assert np.array_equal(files.decode(segs), np.arange(off, off + numel))
    spanned = {(off + i) // part for i in range(numel)}
    assert len(segs) == len(spanned)  # one segment per rank touched, in rank order
    assert [s.file for s in segs] == [f"rank{r}" for r in sorted(spanned)]


# --- stage 1/2 -------------------------------------------------------------------------------------------------


@dataclass
class Group12:
    numels: list[int]
    pads: list[int]

    @property
    def raw(self) -> int:
        return sum(self.numels) + sum(self.pads)


@st.composite
def groups12(draw: st.DrawFn, aligned: bool) -> Group12:
    numels = draw(st.lists(st.integers(1, 40), min_size=1, max_size=6))
    if aligned:
        pads = [draw(st.sampled_from([0, 1, 4, 8])) for _ in numels[:-1]] + [0]
    else:
        pads = [0] * len(numels)
    return Group12(numels, pads)


def shape_of(numel: int, i: int) -> tuple[int, ...]:
    return (2, numel // 2) if numel % 2 == 0 and i % 2 else (numel,)


def build_stage12(
    groups: list[Group12], ws: int, bf16_optimizer: bool, with_pads_key: bool
) -> tuple[Files, list[OrderedDict[str, Any]], list[dict[str, Any]], list[int]]:
    """Rank optimizer states as DeepSpeed writes them, with labelled partitions; returns parts too."""
    files = Files()
    param_shapes: list[OrderedDict[str, Any]] = []
    osds: list[dict[str, Any]] = [
        {
            "single_partition_of_fp32_groups": [],
            "base_optimizer_state": {"state": {}, "param_groups": []},
            "partition_count": [ws] * len(groups),
            "group_paddings": [],
        }
        for _ in range(ws)
    ]
    parts = []
    pid = 0
    for g, grp in enumerate(groups):
        shapes: OrderedDict[str, Any] = OrderedDict()
        chunks = []
        for n, pad in zip(grp.numels, grp.pads, strict=True):
            shapes[f"g{g}.p{pid}"] = shape_of(n, pid)
            chunks += [want(pid, n), np.full(pad, PAD)]
            pid += 1
        param_shapes.append(shapes)
        align = 2 * ws
        padded = math.ceil(grp.raw / align) * align
        part = padded // ws
        parts.append(part)
        flat = np.concatenate([*chunks, np.full(padded - grp.raw, TAIL)])
        for r, osd in enumerate(osds):
            keep = part if bf16_optimizer else min(part, max(0, grp.raw - r * part))
            chunk = flat[r * part : r * part + part]
            base = 4096 * (r * 10 + g)
            osd["single_partition_of_fp32_groups"].append(
                files.ref(f"r{r}g{g}.fp32", chunk[:keep], base, lead=g)
            )
            osd["base_optimizer_state"]["state"][g] = {
                m: files.ref(f"r{r}g{g}.{m}", chunk, base + 2048 * (i + 1))
                for i, m in enumerate(("exp_avg", "exp_avg_sq"))
            }
            osd["base_optimizer_state"]["param_groups"].append(
                {"params": [g], "lr": 0.1, "weight_decay": 0.0}
            )
            osd["group_paddings"].append(min(part, max(0, (r + 1) * part - grp.raw)))
    for osd in osds:
        if not bf16_optimizer:
            osd["zero_stage"] = 2
            if with_pads_key:
                osd["param_alignment_paddings"] = [list(grp.pads) for grp in groups]
    return files, param_shapes, osds, parts


@st.composite
def stage12_cases(draw: st.DrawFn) -> tuple[list[Group12], int, bool, bool]:
    bf16_optimizer = draw(st.booleans())
    aligned = not bf16_optimizer and draw(st.booleans())
    groups = draw(st.lists(groups12(aligned), min_size=1, max_size=3))
    ws = draw(st.integers(1, 8))
    with_pads_key = aligned or draw(st.booleans())  # older versions have no param_alignment_paddings
    return groups, ws, bf16_optimizer, with_pads_key


@SETTINGS
@given(stage12_cases())
@example(([Group12([3], [0])], 8, False, True))  # raw 3, W 8: P = 2, ranks 2..7 hold only padding
@example(([Group12([1, 2], [0, 0]), Group12([5, 1, 1], [4, 8, 0])], 6, False, True))  # padding spans ranks
@example(([Group12([7], [0])], 5, True, False))  # BF16_Optimizer keeps full partitions
def test_stage12_layout_matches_naive_buffer(case: tuple[list[Group12], int, bool, bool]) -> None:
    """param_shapes walk with alignment paddings over DP-ordered partitions gives every parameter."""
    groups, ws, bf16_optimizer, with_pads_key = case
    files, param_shapes, osds, parts = build_stage12(groups, ws, bf16_optimizer, with_pads_key)
    lay = stage12(param_shapes, osds, [f"rank{r}.pt" for r in range(ws)])
    assert lay.findings == []
    assert lay.master_dtype == "float32"
    pid = 0
    for g, (grp, shapes) in enumerate(zip(groups, param_shapes, strict=True)):
        info = lay.groups[g]
        part = parts[g]
        assert (info.numel, info.partition_numel, info.padded_numel) == (sum(grp.numels), part, part * ws)
        assert info.param_count == len(grp.numels)
        assert info.alignment == sum(grp.pads)
        # every padding element is counted once, on the rank that holds it: the tail and the alignment
        # between parameters, so parameters + padding add up to each partition and to the whole group
        assert sum(lay.rank_groups[r][g].param_numel for r in range(ws)) == sum(grp.numels)
        assert sum(lay.rank_groups[r][g].alignment for r in range(ws)) == sum(grp.pads)
        for r in range(ws):
            rg = lay.rank_groups[r][g]
            tail = min(part, max(0, (r + 1) * part - grp.raw))
            assert (rg.partition_numel, rg.padding) == (part, tail)
            assert rg.stored_numel == (part if bf16_optimizer else part - tail)
        for name, shape in shapes.items():
            t = lay.params[name]
            assert t.shape == shape and t.group == g and t.dtype == "float32"
            expect = want(pid, math.prod(shape))
            assert np.array_equal(files.decode(t.segments), expect), name
            moments = dict(t.moments)
            for m in ("exp_avg", "exp_avg_sq"):
                assert np.array_equal(files.decode(moments[m]), expect), (name, m)
            pid += 1
    assert len(lay.params) == pid


@SETTINGS
@given(stage12_cases(), st.data())
def test_stage12_rejects_wrong_partition_lengths(
    case: tuple[list[Group12], int, bool, bool], data: st.DataObject
) -> None:
    """A rank whose fp32 partition is longer than P, or too short to hold its share, is corrupt."""
    groups, ws, bf16_optimizer, with_pads_key = case
    files, param_shapes, osds, parts = build_stage12(groups, ws, bf16_optimizer, with_pads_key)
    r = data.draw(st.integers(0, ws - 1))
    g = data.draw(st.integers(0, len(groups) - 1))
    ref = osds[r]["single_partition_of_fp32_groups"][g]
    need = min(parts[g], max(0, groups[g].raw - r * parts[g]))
    bad_len = data.draw(st.sampled_from([parts[g] + 1] + ([need - 1] if need > 0 else [])))
    osds[r]["single_partition_of_fp32_groups"][g] = files.ref(
        f"bad{r}", np.zeros(bad_len, np.int64), ref.storage.offset
    )
    with pytest.raises(CorruptFileError):
        stage12(param_shapes, osds, [f"rank{i}.pt" for i in range(ws)])


def test_stage12_partition_count_mismatch_is_an_error_finding() -> None:
    """partition_count says 3 ranks, but only 2 files: an error finding, not a silent rebuild."""
    _, param_shapes, osds, _ = build_stage12([Group12([10, 3], [0, 0])], 2, False, True)
    for osd in osds:
        osd["partition_count"] = [3]
    lay = stage12(param_shapes, osds, ["a.pt", "b.pt"])
    assert [(f.severity, f.code) for f in lay.findings] == [(Severity.ERROR, "partition-count")]


def test_stage12_alignment_list_length_mismatch() -> None:
    """param_alignment_paddings with the wrong number of entries is reported, not trusted."""
    _, param_shapes, osds, _ = build_stage12([Group12([10, 3, 4], [0, 0, 0])], 2, False, True)
    for osd in osds:
        osd["param_alignment_paddings"] = [[0, 0]]
    lay = stage12(param_shapes, osds, ["a.pt", "b.pt"])
    assert "alignment" in [f.code for f in lay.findings]


# --- stage 3 -------------------------------------------------------------------------------------------------------


def build_stage3(
    subgroups: list[list[int]], ws: int
) -> tuple[Files, list[OrderedDict[str, Any]], list[dict[str, Any]]]:
    """Each rank's fp32_flat_groups: per sub-group, its ceil(numel/ws) slice of every parameter, padded."""
    files = Files()
    param_shapes: list[OrderedDict[str, Any]] = []
    per_rank: list[list[np.ndarray]] = [[] for _ in range(ws)]
    pid = 0
    for numels in subgroups:
        shapes: OrderedDict[str, Any] = OrderedDict()
        slices: list[list[np.ndarray]] = [[] for _ in range(ws)]
        for n in numels:
            shapes[f"p{pid}"] = shape_of(n, pid)
            p = math.ceil(n / ws)
            full = np.concatenate([want(pid, n), np.full(p * ws - n, PAD)])
            for r in range(ws):
                slices[r].append(full[r * p : (r + 1) * p])
            pid += 1
        param_shapes.append(shapes)
        for r in range(ws):
            per_rank[r].append(np.concatenate(slices[r]))
    osds = []
    for r in range(ws):
        flats = [
            files.ref(f"r{r}s{g}.fp32", a, 8192 * (r * 8 + g), lead=r) for g, a in enumerate(per_rank[r])
        ]
        state = {
            g: {
                m: files.ref(f"r{r}s{g}.{m}", a, 8192 * (r * 8 + g) + 4096 * (i + 1))
                for i, m in enumerate(("exp_avg", "exp_avg_sq"))
            }
            for g, a in enumerate(per_rank[r])
        }
        osds.append(
            {
                "zero_stage": 3,
                "partition_count": ws,
                "fp32_flat_groups": flats,
                "optimizer_state_dict": {
                    "state": state,
                    "param_groups": [{"params": list(range(len(subgroups)))}],
                },
            }
        )
    return files, param_shapes, osds


@SETTINGS
@given(
    st.lists(st.lists(st.integers(1, 40), min_size=1, max_size=5), min_size=1, max_size=4), st.integers(1, 9)
)
@example([[1, 1, 1]], 8)  # numel < ws: only rank 0 holds data
@example([[17, 3], [64]], 5)
def test_stage3_layout_matches_naive_slices(subgroups: list[list[int]], ws: int) -> None:
    """Each parameter is ceil(numel/ws)-sliced across ranks; concatenating slices and trimming rebuilds it."""
    files, param_shapes, osds = build_stage3(subgroups, ws)
    lay = stage3(param_shapes, osds, [f"rank{r}.pt" for r in range(ws)])
    assert lay.findings == []
    pid = 0
    for g, numels in enumerate(subgroups):
        total = sum(math.ceil(n / ws) for n in numels)
        info = lay.groups[g]
        assert (info.numel, info.partition_numel, info.padded_numel) == (sum(numels), total, total * ws)
        for r in range(ws):
            real = sum(max(0, min(math.ceil(n / ws), n - r * math.ceil(n / ws))) for n in numels)
            rg = lay.rank_groups[r][g]
            assert (rg.stored_numel, rg.padding) == (total, total - real)
        for n in numels:
            t = lay.params[f"p{pid}"]
            assert t.group == g and math.prod(t.shape) == n
            assert len(t.segments) == min(ws, math.ceil(n / math.ceil(n / ws)))
            assert np.array_equal(files.decode(t.segments), want(pid, n))
            for m, segs in t.moments:
                assert np.array_equal(files.decode(segs), want(pid, n)), m
            pid += 1


@SETTINGS
@given(st.lists(st.integers(1, 40), min_size=1, max_size=5), st.integers(2, 6), st.data())
def test_stage3_rejects_wrong_sub_group_length(numels: list[int], ws: int, data: st.DataObject) -> None:
    """A rank's flat sub-group that is not exactly sum(ceil(numel/ws)) long is corrupt (mixed runs)."""
    files, param_shapes, osds = build_stage3([numels], ws)
    r = data.draw(st.integers(0, ws - 1))
    good = osds[r]["fp32_flat_groups"][0].numel
    bad = data.draw(st.sampled_from([good - 1, good + 1, good + ws]))
    osds[r]["fp32_flat_groups"][0] = files.ref("bad", np.zeros(max(bad, 0), np.int64), 0)
    with pytest.raises(CorruptFileError):
        stage3(param_shapes, osds, [f"rank{i}.pt" for i in range(ws)])


def test_stage3_partition_count_mismatch_is_an_error_finding() -> None:
    """partition_count 4 with 2 optimizer files is an error finding."""
    _, param_shapes, osds = build_stage3([[10, 7]], 2)
    for osd in osds:
        osd["partition_count"] = 4
    lay = stage3(param_shapes, osds, ["a.pt", "b.pt"])
    assert [(f.severity, f.code) for f in lay.findings] == [(Severity.ERROR, "partition-count")]


@pytest.mark.parametrize("stage", [2, 3])
def test_strided_flat_partition_is_refused(stage: int) -> None:
    """Flat partitions are sliced by byte offset, so a strided view (valid for torch, never written by
    DeepSpeed) would be read as the wrong elements: refused instead."""
    from inspector.errors import CorruptFileError

    if stage == 2:
        _, shapes, osds, _ = build_stage12([Group12([6, 4], [0, 0])], 2, False, True)
        key = "single_partition_of_fp32_groups"
    else:
        ws = 2
        files = Files()
        shapes = [OrderedDict(a=(6,), b=(4,))]
        osds = [{"fp32_flat_groups": [files.ref(f"r{r}", np.arange(5), 0)]} for r in range(ws)]
        key = "fp32_flat_groups"
    ref = osds[1][key][0]
    osds[1][key][0] = replace(ref, shape=(ref.shape[0] // 2,), stride=(2,))
    build = stage12 if stage == 2 else stage3
    with pytest.raises(CorruptFileError, match="not a dense tensor"):
        build(shapes, osds, ["r0.pt", "r1.pt"])
