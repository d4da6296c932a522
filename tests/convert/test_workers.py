"""The worker count changes no output byte and no memory: a conversion at 2, 16 and 64 workers writes the
same files, each run's peak RSS under 128 MiB and 64 workers no larger than 2 (one buffer budget, divided);
the same for `--source module`, `--format model` and `--format merged` (whose adapted weights are computed on
the pipeline's workers), and shards written side by side share that budget."""

from __future__ import annotations

import hashlib
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from inspector.convert import pipeline
from inspector.convert.executor import execute
from inspector.convert.options import ConvertOptions
from inspector.convert.pipeline import pool_plan
from inspector.convert.plan import build_plan
from inspector.demo.writer import DemoSpec
from inspector.scan.scanner import scan
from inspector.system import limits
from tests.child_rss import run_child, run_cli
from tests.conftest import DemoCache

REPO = Path(__file__).resolve().parents[2]

MiB = 1 << 20
SPEC = DemoSpec(stage=2, world_size=2, dtype="bf16", params=12_000_000)


def _digests(out: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(out.iterdir())}


@pytest.mark.parametrize("dtype", ["bf16", "fp32"])
def test_workers_change_no_byte_and_no_memory(demo: DemoCache, tmp_path: Path, dtype: str) -> None:
    root = demo(SPEC)
    peaks, files = {}, {}
    for w in (2, 16, 64):
        out = tmp_path / f"out{w}"
        args = ["convert", str(root), str(out), "--format", "weights", "--dtype", dtype, "--workers", str(w)]
        peaks[w], _ = run_cli(args)
        files[w] = _digests(out)
    assert files[2] == files[16] == files[64]
    assert all(p <= 128 * MiB for p in peaks.values()), peaks
    assert peaks[64] <= peaks[2] + 8 * MiB, peaks


def test_more_workers_get_smaller_buffers_in_the_same_budget(demo: DemoCache) -> None:
    plan = build_plan(scan(str(demo(SPEC))), ConvertOptions(dtype="bf16"))
    budget = plan.buffer_bytes
    for workers in (1, 2, 3, 8, 16, 64, 96, 1024):
        depth, limit = pool_plan(plan, workers)
        src = max(s.buffer_size(limit) for s in plan.shards)
        out = max(s.out_buffer_size(limit) for s in plan.shards)
        assert depth * (src + out) <= budget, workers
        assert depth >= plan.depth


def test_a_merge_changes_no_byte_and_no_memory_with_workers(demo: DemoCache, tmp_path: Path) -> None:
    """The merged kind runs on the pipeline's workers in its one budget: a 48 MiB fp32 weight with a LoRA
    pair merged at 2, 16 and 64 workers gives the same bytes, under 128 MiB, 64 workers no larger than 2."""
    from tests.convert.merge_child import write_lora

    lora = tmp_path / "lora"
    write_lora(lora, rows=3072, cols=4096, rank=16)
    child = str(Path(__file__).with_name("merge_child.py"))
    peaks, files = {}, {}
    for w in (2, 16, 64):
        out = tmp_path / f"out{w}"
        peaks[w] = run_child([child, str(demo(SPEC)), str(lora), str(out), str(w)])[0]
        files[w] = _digests(out)
    assert files[2] == files[16] == files[64]
    assert all(p <= 128 * MiB for p in peaks.values()), peaks
    assert peaks[64] <= peaks[2] + 8 * MiB, peaks


def test_merged_weights_are_computed_on_the_workers(
    demo: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every chunk of an adapted weight is computed by the pipeline's workers (not a serial writer of its
    own), chunks of it in flight at once, and the result is the merge numpy computes."""
    from safetensors.numpy import load_file

    from tests.convert.kinds.hf import expected, lora_checkpoint, plan_export, write

    seen: list[tuple[str, str]] = []
    real = pipeline._work

    def spy(io: Any, c: Any, *a: Any) -> None:
        seen.append((c.t.name, threading.current_thread().name))
        real(io, c, *a)

    monkeypatch.setattr(pipeline, "_work", spy)
    ckpt = lora_checkpoint(demo, tmp_path)
    write(
        plan_export(ckpt, ConvertOptions(dtype="fp32", chunk_elems=4, workers=4), merge=True), tmp_path / "o"
    )
    q = "model.layers.0.self_attn.q_proj.weight"
    assert [n for n, _ in seen].count(q) > 1  # several chunks of the 8 x 6 weight
    assert all(thread.startswith("zi-convert") for _, thread in seen)
    got = load_file(tmp_path / "o" / "model.safetensors")
    np.testing.assert_allclose(got[q], expected(ckpt, 2.0, 2.0)[q], rtol=1e-6, atol=1e-6)


def test_source_module_and_model_folders_change_no_byte_and_no_memory(
    demo: DemoCache, tmp_path: Path
) -> None:
    """`--source module` (kernel copies of the 16-bit copies) and `--format model` run on the same workers
    in the same budget: the same bytes at 2, 16 and 64 workers, peak RSS flat."""
    from tests.convert.kinds.hf import trainer_run

    run = trainer_run(demo, tmp_path)
    for args in (
        ["convert", str(demo(SPEC)), "--format", "weights", "--source", "module"],
        ["convert", str(run), "--format", "model", "--dtype", "bf16"],
    ):
        peaks, files = {}, {}
        for w in (2, 16, 64):
            out = tmp_path / f"{args[3]}{w}"
            peaks[w], _ = run_cli([*args[:2], str(out), *args[2:], "--workers", str(w)])
            files[w] = _digests(out)
        assert files[2] == files[16] == files[64], args
        assert all(p <= 128 * MiB for p in peaks.values()), (args, peaks)
        assert peaks[64] <= peaks[2] + 8 * MiB, (args, peaks)


def test_shards_are_written_side_by_side_in_one_pool(
    demo: DemoCache, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With several shards and workers, two shards are written at once, from one pool of buffers made once,
    and the files are the bytes one worker writes."""
    from inspector.convert.kinds.safetensors import weights_job

    made: list[int] = []
    real_pools = pipeline.make_pools

    def counting(*a: Any, **kw: Any) -> Any:
        made.append(1)
        return real_pools(*a, **kw)

    active, most = [0], [0]
    lock = threading.Lock()
    real_shard = pipeline.write_shard

    def tracked(*a: Any, **kw: Any) -> Any:
        with lock:
            active[0] += 1
            most[0] = max(most[0], active[0])
        try:
            time.sleep(0.05)  # both writers get going before either can finish
            yield from real_shard(*a, **kw)
        finally:
            with lock:
                active[0] -= 1

    monkeypatch.setattr(pipeline, "make_pools", counting)
    monkeypatch.setattr(pipeline, "write_shard", tracked)
    ckpt = scan(str(demo(SPEC)))
    digests = {}
    for w in (1, 4):
        plan = build_plan(ckpt, ConvertOptions(dtype="bf16", shard_size=4_000_000, workers=w))
        job = weights_job(plan, str(tmp_path / f"out{w}"))
        assert len(plan.shards) > 2 and job.workers == min(2, w)
        most[0], made[:] = 0, []
        execute(job)
        assert most[0] == job.workers and len(made) == 1
        digests[w] = _digests(tmp_path / f"out{w}")
    assert digests[1] == digests[4]


def test_locally_no_more_workers_than_cores(demo: DemoCache, monkeypatch: pytest.MonkeyPatch) -> None:
    """A worker beyond the usable cores would only read ahead of a free core: locally 16 asked run as the
    cores (`limits.busy_threads`), with the buffers those get; the default is every usable core."""
    monkeypatch.setattr(limits, "usable_cores", lambda: 3)
    ckpt = scan(str(demo(SPEC)))
    for asked, runs in ((16, 3), (2, 2), (None, 3)):
        plan = build_plan(ckpt, ConvertOptions(dtype="bf16", workers=asked))
        assert pipeline.plan_threads(plan) == runs, asked


def test_threads_beyond_the_cores_change_no_byte(
    demo: DemoCache, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As on a node of many cores without the GIL (where every worker runs): 1, 5 and 16 threads, chunks
    small enough that every tensor is cut many times, write the same bytes, and 16 do run side by side."""
    from inspector.convert.kinds.safetensors import weights_job

    monkeypatch.setattr(limits, "usable_cores", lambda: 64)  # as on a node of many cores
    monkeypatch.setattr(limits, "gil_enabled", lambda: False)
    seen: set[str] = set()
    real = pipeline._work

    def spy(io: Any, c: Any, *a: Any) -> None:
        seen.add(threading.current_thread().name)
        real(io, c, *a)

    monkeypatch.setattr(pipeline, "_work", spy)
    ckpt = scan(str(demo(SPEC)))
    digests = {}
    for w in (1, 5, 16):
        seen.clear()
        plan = build_plan(ckpt, ConvertOptions(dtype="bf16", workers=w, chunk_elems=40_000))
        execute(weights_job(plan, str(tmp_path / f"out{w}")))
        digests[w] = _digests(tmp_path / f"out{w}")
        assert len(seen) > 2 if w == 16 else len(seen) <= w, (w, seen)
    assert digests[1] == digests[5] == digests[16]


def test_the_universal_export_defaults_to_its_own_ceiling(
    demo: DemoCache, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """By default a universal export runs up to ZIP_THREADS workers (its CRC-32 holds no GIL for a whole MiB;
    8 beat 4 on 16 cores), the other passes up to LOCAL_THREADS; both no more than the usable cores, and an
    explicit --workers as asked up to the same ceiling (16 threads took 1.5 times 8's time); without the
    GIL, every core."""
    from inspector.convert.kinds import get
    from inspector.convert.kinds.base import Request

    ckpt = scan(str(demo(SPEC)))

    def universal(asked: int | None) -> int:
        job = get("universal").plan(ckpt, Request(ConvertOptions(workers=asked)), str(tmp_path / "uni"))
        return int(job.workers)

    monkeypatch.setattr(limits, "usable_cores", lambda: 16)
    assert limits.ZIP_THREADS > limits.LOCAL_THREADS
    assert universal(None) == limits.ZIP_THREADS
    assert pipeline.plan_threads(build_plan(ckpt, ConvertOptions(dtype="bf16"))) == limits.LOCAL_THREADS
    assert universal(3) == 3 and universal(12) == limits.ZIP_THREADS
    assert (
        pipeline.plan_threads(build_plan(ckpt, ConvertOptions(dtype="bf16", workers=12)))
        == limits.LOCAL_THREADS
    )
    monkeypatch.setattr(limits, "usable_cores", lambda: 6)
    assert universal(None) == 6
    monkeypatch.setattr(limits, "usable_cores", lambda: 16)
    monkeypatch.setattr(limits, "gil_enabled", lambda: False)
    assert universal(None) == 16 and universal(12) == 12
