"""`preflight.assess` against fake limits, its predictions against real runs, and the CLI's exit code 3.

The converter baseline is pinned (`converter_baseline` patched) where a test compares predictions, so the numbers
depend only on the plan. The CLI is driven into "does not fit" with a Slurm allocation of 1 MiB, which
`inspector.system` reads from the environment like a real job's.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

import inspector.convert.preflight as preflight
from inspector.convert.options import CHUNK_ELEMS, ConvertOptions
from inspector.convert.plan import INDEX_NAME, ConversionPlan, build_plan
from inspector.convert.preflight import SAFETY_FRACTION, Assessment, assess, assessment_json
from inspector.demo.writer import DemoSpec
from inspector.scan.model import Checkpoint
from inspector.scan.scanner import scan
from inspector.system.limits import MemoryBudget, MemoryLimit
from tests.convert.jobs import execute

if TYPE_CHECKING:
    from conftest import CliResult, DemoCache

MiB = 1024 * 1024
GiB = 1024 * MiB
SMALL = DemoSpec(stage=3, world_size=2, dtype="bf16", params=200_000)
BIG = DemoSpec(stage=3, world_size=2, dtype="bf16", params=2_000_000)
RSS, VMS = 300 * MiB, 3 * GiB  # pinned "this process" for deterministic predictions
JSON_KEYS = {
    "predicted_peak_rss_bytes",
    "output_bytes",
    "estimated_seconds",
    "available_memory_bytes",
    "memory_limit_source",
    "free_disk_bytes",
    "fits",
    "deepspeed_zero_to_fp32_peak_rss_bytes",
}


def budget(nbytes: int, address_space: int | None = None) -> MemoryBudget:
    """A MemoryBudget with one fake cgroup limit (and optionally an RLIMIT_AS)."""
    lim = MemoryLimit(nbytes, "cgroup-v2", f"memory.max = {nbytes} (test)", limit=nbytes, in_use=0)
    return MemoryBudget(limits=(lim,), effective=lim, address_space_limit=address_space, total_ram=64 * GiB)


@pytest.fixture
def pinned(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make the converter's baseline a constant 300 MiB RSS / 3 GiB VMS."""
    monkeypatch.setattr(preflight, "converter_baseline", lambda plan: (RSS, VMS))


@pytest.fixture(scope="module")
def small(demo: DemoCache) -> Checkpoint:
    return scan(str(demo(SMALL)))


@pytest.fixture(scope="module")
def small_plan(small: Checkpoint) -> ConversionPlan:
    return build_plan(small, ConvertOptions(shard_size=300_000))


def roomy(plan: ConversionPlan, out: Path) -> Assessment:
    return assess(plan, str(out), budget=budget(64 * GiB), free_disk=10**13)


# --- verdicts -------------------------------------------------------------------------------------------------


def test_fits_with_room(small_plan: ConversionPlan, tmp_path: Path, pinned: None) -> None:
    a = roomy(small_plan, tmp_path)
    assert a.fits and a.fits_memory and a.fits_disk and a.fits_address_space
    assert a.problem == ""
    assert a.predicted_peak_rss == RSS + small_plan.buffer_bytes + preflight.RUNTIME_OVERHEAD
    assert a.memory_margin == 64 * GiB - a.predicted_peak_rss
    assert a.disk_margin == 10**13 - small_plan.output_bytes
    assert a.estimated_seconds > 0


def test_memory_boundary(small_plan: ConversionPlan, tmp_path: Path, pinned: None) -> None:
    """A fit needs the peak plus a safety margin under the limit; one byte less of limit flips it."""
    peak = roomy(small_plan, tmp_path).predicted_peak_rss
    enough = -(-peak * 100 // int(100 * (1 - SAFETY_FRACTION))) + 1
    assert assess(small_plan, str(tmp_path), budget=budget(enough), free_disk=10**13).fits_memory
    a = assess(small_plan, str(tmp_path), budget=budget(peak), free_disk=10**13)
    assert not a.fits_memory and not a.fits
    assert a.fits_disk and a.fits_address_space


def test_memory_does_not_fit_says_what_to_change(small_plan: ConversionPlan, tmp_path: Path) -> None:
    a = assess(small_plan, str(tmp_path), budget=budget(1 * MiB), free_disk=10**13)
    assert not a.fits_memory and not a.fits
    assert "RAM" in a.problem and "1.0 MiB" in a.problem and "memory.max" in a.problem
    assert "memory limit" in a.advice and "--shard-size will not help" in a.advice
    assert "--force" in a.advice
    assert "disk" not in a.problem


def test_disk_does_not_fit_says_what_to_change(small_plan: ConversionPlan, tmp_path: Path) -> None:
    exact = small_plan.output_bytes
    assert assess(small_plan, str(tmp_path), budget=budget(64 * GiB), free_disk=exact).fits_disk
    a = assess(small_plan, str(tmp_path), budget=budget(64 * GiB), free_disk=exact - 1)
    assert not a.fits_disk and not a.fits and a.fits_memory
    assert "output needs" in a.problem and str(tmp_path) in a.problem
    assert "free disk space" in a.advice.lower() and "another disk" in a.advice
    assert a.disk_margin == -1


def test_address_space_does_not_fit(small_plan: ConversionPlan, tmp_path: Path, pinned: None) -> None:
    vms = assess(small_plan, str(tmp_path), budget=budget(64 * GiB), free_disk=10**13).predicted_vms
    assert vms > VMS
    ok = assess(small_plan, str(tmp_path), budget=budget(64 * GiB, address_space=vms), free_disk=10**13)
    assert ok.fits_address_space and ok.fits
    a = assess(small_plan, str(tmp_path), budget=budget(64 * GiB, address_space=vms - 1), free_disk=10**13)
    assert not a.fits_address_space and not a.fits and a.fits_memory
    assert "RLIMIT_AS" in a.problem and "ulimit -v" in a.advice


def test_everything_short_lists_every_problem(small_plan: ConversionPlan, tmp_path: Path) -> None:
    a = assess(small_plan, str(tmp_path), budget=budget(MiB, address_space=MiB), free_disk=0)
    assert not (a.fits_memory or a.fits_disk or a.fits_address_space)
    for words in ("RAM", "RLIMIT_AS", "output needs"):
        assert words in a.problem
    for words in ("free disk space", "memory limit", "ulimit -v", "--force"):
        assert words in a.advice.lower()


def test_prediction_is_for_the_converter_process_not_this_one(
    small_plan: ConversionPlan, tmp_path: Path
) -> None:
    """The TUI (textual loaded) and the CLI must get the same answer: this process's own memory is no input."""
    before = roomy(small_plan, tmp_path).predicted_peak_rss
    ballast = bytearray(200 * MiB)  # this process grows by 200 MiB ...
    ballast[::4096] = b"x" * len(ballast[::4096])
    assert roomy(small_plan, tmp_path).predicted_peak_rss == before  # ... the converter would not
    del ballast
    base, _ = preflight.converter_baseline(small_plan)
    assert before == base + small_plan.buffer_bytes + preflight.RUNTIME_OVERHEAD
    assert preflight.CONVERTER_BASE_RSS <= base < preflight.CONVERTER_BASE_RSS + 4 * MiB


# --- predictions ----------------------------------------------------------------------------------------------


def test_peak_does_not_grow_with_model_size(
    demo: DemoCache, small: Checkpoint, tmp_path: Path, pinned: None
) -> None:
    """200k vs 2M params: our predicted peak stays within a few MiB, because chunk buffers are capped by the
    largest tensor (and by the chunk size); with a chunk smaller than both models' largest tensor it is equal.
    DeepSpeed's own tool, for contrast, grows with the trainable parameters."""
    big = scan(str(demo(BIG)))
    plans = [build_plan(c, ConvertOptions(dtype="fp32")) for c in (small, big)]
    assert plans[1].tensor_bytes > 6 * plans[0].tensor_bytes
    a_small, a_big = (roomy(p, tmp_path) for p in plans)
    # the largest tensors are 72k vs 229k elements: 3 chunks x 12 B/element -> ~5.7 MB apart, not ~7 MB of
    # output (or more) as a prediction proportional to the model would be
    assert abs(a_big.predicted_peak_rss - a_small.predicted_peak_rss) < 8 * MiB
    assert plans[1].buffer_bytes <= 3 * CHUNK_ELEMS * (8 + 8)

    capped = [build_plan(c, ConvertOptions(dtype="fp32", chunk_elems=8192)) for c in (small, big)]
    assert roomy(capped[0], tmp_path).predicted_peak_rss == roomy(capped[1], tmp_path).predicted_peak_rss

    trainable = [sum(t.numel for t in c.tensors if t.kind.value == "trainable") for c in (small, big)]
    assert a_big.deepspeed_peak_rss - a_small.deepspeed_peak_rss >= 4 * (trainable[1] - trainable[0])


def test_deepspeed_stage2_needs_more_than_stage3(demo: DemoCache, small: Checkpoint, tmp_path: Path) -> None:
    """Stage 1/2 concatenates every group's partitions (memory doubles); stage 3 gathers lazily."""
    stage2 = scan(str(demo(DemoSpec(stage=2, world_size=2, dtype="bf16", params=200_000))))
    p2, p3 = (build_plan(c, ConvertOptions()) for c in (stage2, small))
    assert p2.tensor_bytes == p3.tensor_bytes
    d2, d3 = roomy(p2, tmp_path).deepspeed_peak_rss, roomy(p3, tmp_path).deepspeed_peak_rss
    assert d2 > d3 > preflight.DEEPSPEED_BASE_RSS


def test_output_bytes_are_exact(small: Checkpoint, small_plan: ConversionPlan, tmp_path: Path) -> None:
    """The predicted output size is the plan's exact byte count, and what execute then writes."""
    a = roomy(small_plan, tmp_path)
    assert a.output_bytes == small_plan.output_bytes
    assert a.read_bytes == sum(seg.nbytes for s in small_plan.shards for t in s.tensors for seg in t.segments)
    out = tmp_path / "out"
    report = execute(small_plan, str(out))
    on_disk = sum(p.stat().st_size for p in out.iterdir())
    assert on_disk == a.output_bytes == report.bytes_written
    assert (out / INDEX_NAME).exists()


def test_assessment_json_keys(small_plan: ConversionPlan, tmp_path: Path) -> None:
    """`preflight --json` for a safetensors job: the shared keys plus the job's own."""
    from inspector.cli.preflight import preflight_json
    from inspector.convert.kinds.safetensors import SafetensorsJob

    job = SafetensorsJob("weights", str(tmp_path), small_plan)
    data = preflight_json(job, roomy(small_plan, tmp_path))
    assert set(assessment_json(roomy(small_plan, tmp_path))) < set(data)
    assert set(data) >= JSON_KEYS
    json.dumps(data)  # serialisable
    assert data["fits"] is True and data["problem"] == ""
    assert data["available_memory_bytes"] == 64 * GiB and data["memory_limit_source"] == "cgroup-v2"
    assert data["shards"] == len(small_plan.shards) and data["tensors"] == small_plan.tensor_count


# --- CLI ------------------------------------------------------------------------------------------------------


@pytest.fixture
def slurm_1mib(monkeypatch: pytest.MonkeyPatch) -> None:
    """A Slurm job with 1 MiB per node: every conversion is too big for it."""
    monkeypatch.setenv("SLURM_JOB_ID", "1")
    monkeypatch.setenv("SLURM_MEM_PER_NODE", "1")
    monkeypatch.delenv("SLURM_MEM_PER_CPU", raising=False)


def test_cli_preflight_json(
    demo: DemoCache, small: Checkpoint, tmp_path: Path, cli: Callable[..., CliResult]
) -> None:
    res = cli("preflight", demo(SMALL), "--json", "--out", tmp_path / "out", "--shard-size", "300KB")
    assert res.rc == 0, res.output
    data = json.loads(res.stdout)
    assert set(data) >= JSON_KEYS
    for key in JSON_KEYS - {"fits", "memory_limit_source", "estimated_seconds"}:
        assert isinstance(data[key], int) and data[key] > 0, key
    assert data["fits"] is True
    assert isinstance(data["memory_limit_source"], str)
    assert data["output_bytes"] == build_plan(small, ConvertOptions(shard_size=300_000)).output_bytes
    assert not (tmp_path / "out").exists(), "preflight must not create the output folder"


def test_cli_preflight_does_not_fit(
    demo: DemoCache, tmp_path: Path, cli: Callable[..., CliResult], slurm_1mib: None
) -> None:
    res = cli("preflight", demo(SMALL), "--json", "--out", tmp_path)
    assert res.rc == 3, res.output
    data = json.loads(res.stdout)
    assert data["fits"] is False and data["fits_memory"] is False
    assert data["memory_limit_source"] == "slurm-mem-per-node"
    assert data["available_memory_bytes"] == MiB
    assert "SLURM_MEM_PER_NODE" in data["problem"]

    text = cli("preflight", demo(SMALL), "--out", tmp_path)
    assert text.rc == 3, text.output
    assert "Does not fit" in text.stdout and "SLURM_MEM_PER_NODE" in text.stdout and "--force" in text.stdout
    assert "Traceback" not in text.output


def test_cli_convert_refuses_unless_forced(
    demo: DemoCache, tmp_path: Path, cli: Callable[..., CliResult], slurm_1mib: None
) -> None:
    out = tmp_path / "out"
    res = cli("convert", demo(SMALL), out)
    assert res.rc == 3, res.output
    assert "would not fit" in res.output and "SLURM_MEM_PER_NODE" in res.output and "--force" in res.output
    assert res.output.lower().count("would not fit") == 1
    assert "not fit" not in res.stdout  # one message per error, on stderr
    assert "Traceback" not in res.output
    assert not out.exists() or os.listdir(out) == []

    forced = cli("convert", demo(SMALL), out, "--force")
    assert forced.rc == 0, forced.output
    assert "--force given" in forced.stdout and "Done" in forced.stdout
    assert os.listdir(out) == ["model.safetensors"]


COMMON_KEYS = {
    "output_kind",
    "fits",
    "fits_memory",
    "fits_disk",
    "fits_address_space",
    "output_writable",
    "predicted_peak_rss_bytes",
    "output_bytes",
    "read_bytes",
    "estimated_seconds",
    "free_disk_bytes",
    "available_memory_bytes",
    "memory_limit_source",
    "address_space_limit_bytes",
}


def test_preflight_json_has_one_shape_for_every_kind(demo: Any, tmp_path: Path, cli: Any) -> None:
    """The universal verdict used to lack fits_memory/fits_disk/output_kind and skip the headroom and the
    RLIMIT_AS check; both kinds now answer the same keys."""
    from inspector.demo.writer import DemoSpec

    root = demo(DemoSpec(params=30_000))
    docs = {}
    for fmt in ("safetensors", "universal"):
        res = cli("preflight", root, "--out", tmp_path / fmt, "--format", fmt, "--json")
        assert res.rc == 0, res.output
        docs[fmt] = json.loads(res.stdout)
        assert set(docs[fmt]) >= COMMON_KEYS, COMMON_KEYS - set(docs[fmt])
    assert docs["universal"]["output_kind"] == "universal" and docs["safetensors"]["output_kind"] == "weights"


def test_universal_verdict_keeps_the_same_headroom(demo: Any, tmp_path: Path) -> None:
    """A peak within 5 % of the limit does not fit, for universal as for safetensors."""

    from inspector.convert.kinds.universal.plan import plan_universal
    from inspector.convert.kinds.universal.preflight import assess_universal
    from inspector.convert.preflight import SAFETY_FRACTION
    from inspector.demo.writer import DemoSpec
    from inspector.scan.scanner import scan

    plan = plan_universal(scan(str(demo(DemoSpec(params=30_000)))), str(tmp_path))
    est = assess_universal(plan, budget(64 * GiB), 10**13)
    tight = assess_universal(plan, budget(int(est.predicted_peak_rss / (1 - SAFETY_FRACTION / 2))), 10**13)
    assert est.fits and not tight.fits_memory and not tight.fits
    capped = assess_universal(plan, budget(64 * GiB, address_space=est.predicted_vms - 1), 10**13)
    assert not capped.fits_address_space and not capped.fits


def test_a_bucket_source_is_timed_at_the_network_rate_not_the_disks() -> None:
    """The read side of the estimate: the page cache's rate for local files, the assumed network rate (and
    the scan's round trips) when a source is an object store."""
    from types import SimpleNamespace

    local = (SimpleNamespace(root="/ckpt"),)
    remote = (SimpleNamespace(root="s3://bucket/ckpt"),)
    n = 1 << 30
    assert preflight.read_seconds(n, local) == n / preflight.READ_BYTES_PER_S
    assert preflight.read_seconds(n, remote) == pytest.approx(
        preflight.REMOTE_STARTUP_SECONDS + n / preflight.REMOTE_READ_BYTES_PER_S
    )
    assert preflight.read_seconds(n, remote) > 5 * preflight.read_seconds(n, local)


def test_compact_rank_records_are_counted_as_kept_not_as_the_segments_they_stand_for(demo: Any) -> None:
    """A stage-3 parameter's slices over every rank are one `RankSlices` at rest: the memory prediction counts
    that record, so it grows with the files, not with parameters x ranks (a 4,096-rank 20M demo was predicted
    at 252 MiB and peaked at 96 MiB while each slice was counted)."""
    from inspector.scan.slices import RankSlices

    ckpt = scan(str(demo(DemoSpec(stage=3, world_size=16, dtype="bf16", params=200_000))))
    tensors = [t for t in ckpt.tensors if isinstance(t.segments, RankSlices)]
    assert tensors and any(len(t.segments) > 1 for t in tensors)
    assert all(preflight.kept_records(t.segments) == 1 for t in tensors)
    plan = build_plan(ckpt, ConvertOptions(dtype="bf16"))
    per_segment = sum(len(t.segments) for s in plan.shards for t in s.tensors)
    kept = sum(preflight.kept_records(t.segments) for s in plan.shards for t in s.tensors)
    assert kept < per_segment
    files = len({seg.file for s in plan.shards for t in s.tensors for seg in t.segments})
    headers = sum(len(s.header) for s in plan.shards)
    base = preflight.converter_baseline(plan)[0]
    assert base == preflight.converter_base(kept, plan.tensor_count, files, headers)[0]
    assert base < preflight.converter_base(per_segment, plan.tensor_count, files, headers)[0]
