"""Stage-3 placement kept compact (issue 43): a parameter's slices over the ranks are one `RankSlices` record
over its sub-group's per-rank starts, read as the tuple of segments it stands for. Pinned three ways: the
records equal the partition rule written out naively, and a conversion and a universal checkpoint written
from them are byte for byte those written from the same records spelled out as plain tuples (bf16 output
also equal to DeepSpeed's values, the demo's reference)."""

from __future__ import annotations

import dataclasses
import pickle
from pathlib import Path
from typing import Any

from inspector.convert.kinds.universal.plan import plan_universal
from inspector.convert.options import ConvertOptions
from inspector.convert.plan import build_plan
from inspector.demo.writer import DemoSpec
from inspector.scan.model import Checkpoint, Kind, Segment
from inspector.scan.scanner import scan
from inspector.scan.slices import RankSlices
from tests.convert.jobs import execute
from tests.convert.jobs import universal as write_universal
from tests.convert.test_convert_end_to_end import assert_matches_expected

MANY = DemoSpec(stage=3, world_size=48, dtype="bf16", params=60_000, sub_group_size=20_000)


def spelled_out(ckpt: Checkpoint) -> Checkpoint:
    """The same checkpoint with every segment list a plain tuple (the records before they were compact)."""
    tensors = tuple(
        dataclasses.replace(t, segments=tuple(t.segments), moments=tuple((m, tuple(s)) for m, s in t.moments))
        for t in ckpt.tensors
    )
    return dataclasses.replace(ckpt, tensors=tensors)


def files_of(folder: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(folder)): p.read_bytes()
        for p in sorted(folder.rglob("*"))
        if p.is_file() and not p.name.startswith(".zero-inspector")
    }


def test_slices_are_the_partition_rule_and_share_one_record_per_rank_file(demo: Any) -> None:
    ckpt = scan(str(demo(MANY)))
    ws = ckpt.world_size
    trainable = [t for t in ckpt.tensors if t.kind is Kind.TRAINABLE]
    assert trainable and len(ckpt.groups) > 1
    optim = {r.rank: r.optim_file for r in ckpt.ranks}
    for t in trainable:
        assert isinstance(t.segments, RankSlices)
        p = -(-t.numel // ws)
        segs = list(t.segments)
        assert [s.numel for s in segs] == [min(p, t.numel - r * p) for r in range(len(segs))]
        assert sum(s.numel for s in segs) == t.numel
        assert [s.file for s in segs] == [optim[r] for r in range(len(segs))]
        assert t.segments == tuple(segs) and hash(t.segments) == hash(tuple(segs))
        assert t.segments[1:3] == tuple(segs[1:3]) and t.segments[-1] == segs[-1]
        assert pickle.loads(pickle.dumps(t.segments)) == t.segments
        moments = dict(t.moments)
        assert set(moments) == {"exp_avg", "exp_avg_sq"}
        for m in moments.values():
            assert [s.numel for s in m] == [s.numel for s in segs]
            assert all(isinstance(s, Segment) and s.file == f.file for s, f in zip(m, segs, strict=True))
    # one per-rank table per sub-group and copy, whatever the number of parameters
    tables = {id(t.segments.starts) for t in trainable} | {id(s.starts) for t in trainable for _, s in t.moments}
    assert len(tables) == 3 * len(ckpt.groups)


def test_compact_records_convert_bit_exact_and_as_the_spelled_out_ones(demo: Any, tmp_path: Path) -> None:
    ckpt = scan(str(demo(MANY)))
    outs = {}
    for name, c in (("compact", ckpt), ("tuples", spelled_out(ckpt))):
        plan = build_plan(c, ConvertOptions(dtype="bf16", chunk_elems=1000))
        execute(plan, str(tmp_path / name))
        outs[name] = files_of(tmp_path / name)
        if name == "compact":
            assert_matches_expected(MANY, plan, tmp_path / name)
    assert outs["compact"] == outs["tuples"] and outs["compact"]


def test_a_universal_checkpoint_from_compact_records_is_the_spelled_out_ones(demo: Any, tmp_path: Path) -> None:
    ckpt = scan(str(demo(MANY)))
    outs = {}
    for name, c in (("compact", ckpt), ("tuples", spelled_out(ckpt))):
        plan = plan_universal(c, str(tmp_path / name))
        write_universal(plan)
        outs[name] = files_of(tmp_path / name)
    assert outs["compact"] == outs["tuples"]
    assert any(k.endswith("exp_avg_sq.pt") for k in outs["compact"])


def test_the_bytes_of_compact_slices_are_those_of_their_segments(demo: Any) -> None:
    """`segments_nbytes` answers from the element count (the overview's totals), as the segments sum."""
    from inspector.scan.slices import segments_nbytes

    ckpt = scan(str(demo(MANY)))
    for t in ckpt.tensors:
        assert segments_nbytes(t.segments) == sum(s.nbytes for s in tuple(t.segments)), t.name
        for _, segs in t.moments:
            assert segments_nbytes(segs) == sum(s.nbytes for s in tuple(segs))
