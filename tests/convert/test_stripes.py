"""Runs of small stage-3 parameters read as windows of every rank's flat tensor (`convert/stripes.py`):
the output is byte for byte the one read segment by segment (and DeepSpeed's values), each rank is read
once a run and never past what a slice of the run takes from it, a run never outgrows its buffer, and an
order against the flat tensors' never reads a window backwards."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from inspector.convert.options import ConvertOptions
from inspector.convert.plan import ConversionPlan, build_plan
from inspector.convert.stripes import Stripe, capacity, runs, stripe_reads
from inspector.demo.writer import DemoSpec
from inspector.errors import InspectorError
from inspector.scan.scanner import scan
from inspector.scan.slices import RankSlices
from tests.convert.jobs import execute
from tests.convert.test_convert_end_to_end import assert_matches_expected
from tests.convert.test_rank_slices import files_of, spelled_out

# many small parameters over many ranks (frozen ones too: a table of their own each, in bf16), two groups
DEEP = DemoSpec(stage=3, world_size=40, dtype="bf16", params=80_000, layers=6, sub_group_size=30_000)


def stripes_of(plan: ConversionPlan, limit: int) -> list[Stripe]:
    return [x for s in plan.shards for x in runs(s, limit) if isinstance(x, Stripe)]


@pytest.mark.parametrize(("dtype", "chunk"), [("bf16", 4096), ("bf16", 1 << 21), ("fp32", 1 << 21), ("fp32", 3000)])
def test_stripes_write_the_bytes_segment_by_segment_reads_write(
    demo: Any, tmp_path: Path, dtype: str, chunk: int
) -> None:
    ckpt = scan(str(demo(DEEP)))
    outs = {}
    for name, c in (("stripes", ckpt), ("segments", spelled_out(ckpt))):  # tuples are never striped
        plan = build_plan(c, ConvertOptions(dtype=dtype, chunk_elems=chunk, shard_size=60_000, workers=2))
        if name == "stripes":
            found = stripes_of(plan, plan.chunk_limit)
            assert found and max(len(st.tensors) for st in found) > 1  # runs, not one tensor each
            assert any(st.tensors[0].src_dtype != st.tensors[0].out_dtype for st in found) == (dtype == "bf16")
        else:
            assert not stripes_of(plan, plan.chunk_limit)
        execute(plan, str(tmp_path / name))
        outs[name] = files_of(tmp_path / name)
        assert_matches_expected(DEEP, plan, tmp_path / name)
    assert outs["stripes"] == outs["segments"] and len(outs["stripes"]) > 1


def test_a_bf16_frozen_slice_widened_to_fp32_in_a_stripe(demo: Any) -> None:
    """Frozen stage-3 parameters are bf16 slices of their own fragments: a stripe casts them up."""
    ckpt = scan(str(demo(DEEP)))
    plan = build_plan(ckpt, ConvertOptions(dtype="fp32"))
    widened = [t for st in stripes_of(plan, plan.chunk_limit) for t in st.tensors if t.src_dtype == "bfloat16"]
    assert widened and all(t.out_dtype == "float32" for t in widened)


@pytest.mark.parametrize("chunk", [1500, 4096, 1 << 21])
def test_each_rank_is_read_once_a_run_inside_what_the_runs_slices_span(demo: Any, chunk: int) -> None:
    ckpt = scan(str(demo(DEEP)))
    plan = build_plan(ckpt, ConvertOptions(dtype="bf16", chunk_elems=chunk))
    seen: list[str] = []
    for shard in plan.shards:
        for item in runs(shard, plan.chunk_limit):
            tensors = item.tensors if isinstance(item, Stripe) else [item]
            seen += [t.name for t in tensors]
            if not isinstance(item, Stripe):
                continue
            assert item.rows <= capacity(shard, plan.chunk_limit, item.tensors[0])
            spans: dict[str, list[int]] = {}
            for t in item.tensors:
                for seg in t.segments:
                    lo, hi = spans.setdefault(seg.file, [seg.offset, seg.offset + seg.nbytes])
                    spans[seg.file] = [min(lo, seg.offset), max(hi, seg.offset + seg.nbytes)]
            reads = stripe_reads(item)
            assert len({(f, off) for f, off, _, _ in reads}) == len(reads)
            for f, off, at, n in reads:
                lo, hi = spans[f]
                assert lo <= off and off + n <= hi, (f, off, n, lo, hi)  # between the run's own slices
                assert at >= 0 and at + n <= item.rows * 4
    assert seen == [t.name for s in plan.shards for t in s.tensors]  # every tensor once, in order


def test_an_order_against_the_flat_tensors_reads_no_window_backwards(demo: Any) -> None:
    ckpt = scan(str(demo(DEEP)))
    plan = build_plan(ckpt, ConvertOptions(dtype="bf16"))
    shard = plan.shards[0]
    backwards = dataclasses.replace(shard, tensors=tuple(reversed(shard.tensors)))
    striped = [x for x in runs(backwards, plan.chunk_limit) if isinstance(x, Stripe)]
    assert striped
    for st in striped:  # a rank table (one window) never serves two of them: it would be read backwards
        tables = [id(t.segments.starts) for t in st.tensors if isinstance(t.segments, RankSlices)]
        assert len(tables) == len(set(tables)) == len(st.windows)
    flat = [t for x in runs(backwards, plan.chunk_limit) for t in (x.tensors if isinstance(x, Stripe) else [x])]
    assert flat == list(backwards.tensors)


def test_a_rank_file_cut_short_after_the_scan_is_refused_by_name(demo: Any, tmp_path: Path) -> None:
    ckpt = scan(str(demo(DEEP)))
    plan = build_plan(ckpt, ConvertOptions(dtype="bf16"))
    t = stripes_of(plan, plan.chunk_limit)[0].tensors[0]
    assert isinstance(t.segments, RankSlices)
    assert "truncated" in assert_cut_short_refused(t.segments, lambda: execute(plan, str(tmp_path / "out")))


def assert_cut_short_refused(slices: RankSlices, run: Callable[[], object]) -> str:
    """`run` once rank 1's file of `slices` is cut short inside its slice: refused, naming the file (its
    bytes put back after); the refusal's words."""
    victim = slices[1].file
    kept = Path(victim).read_bytes()
    try:
        with open(victim, "r+b") as fh:
            fh.truncate(slices[1].offset + 2)
        with pytest.raises(InspectorError) as err:
            run()
        assert os.path.basename(victim) in str(err.value)
        return str(err.value)
    finally:
        Path(victim).write_bytes(kept)


def test_preflight_counts_the_reads_the_stripes_make(demo: Any) -> None:
    from inspector.convert.reader import reads_of
    from inspector.convert.stripes import plan_reads

    plan = build_plan(scan(str(demo(DEEP))), ConvertOptions(dtype="bf16"))
    by_file, count = plan_reads(plan, plan.chunk_limit)
    per_segment, segment_reads = reads_of(seg for s in plan.shards for t in s.tensors for seg in t.segments)
    assert set(by_file) == set(per_segment)
    assert all(by_file[f] >= per_segment[f] for f in per_segment)  # slices, and what lies between them
    want = sum(len(w.ends) for st in stripes_of(plan, plan.chunk_limit) for w in st.windows)
    assert count < segment_reads and count >= want
