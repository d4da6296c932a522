#!/usr/bin/env python
"""File-count sweep for DCP folders (issue 43): scan and convert of one model saved by 8 to 1,024 FSDP ranks
(one `.distcp` file a rank), each command a fresh process measured by wait4: wall, CPU (user + system) and
its own peak RSS.

    python tests/benchmarks/dcp_files.py --workdir /tmp/zi-dcp                    # 8 64 256 1024, 8M
    python tests/benchmarks/dcp_files.py --files 8 1024 --params 2M --append      # rows into results.md

The folders are torch's own: `torch.distributed.checkpoint`'s planner and `FileSystemWriter`, as
`dcp.save({"model": ..., "optim": ...})` calls them, run for each rank in turn in one process (a child that
imports torch; this parent does not) over a fake process group (`torch.testing`'s "fake" backend: rank r
of N, no peers): each rank's state dict holds DTensors sharded on dim 0 (FSDP2's layout: the model's
weights and Adam's two moments, a replicated step), the coordinator's global plan dedups and names the files
(`__r_0.distcp`), and `finish` writes `.metadata`. The same rows and columns as `ranks.py`: `scan xN` is the
scan CPU over the first row's (on a shared machine wall is mostly waiting). Timings are not tests: the
machine's cores and load go with the rows.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(Path(__file__).resolve().parent))
from children import child_env  # noqa: E402  (bytecode compiled, as installed)
from ranks import measured, publish, verdict  # noqa: E402  (the rank sweep's measured columns and targets)

ROWS = 1024  # rows of every weight: one or more a rank at 1,024 ranks (FSDP2 shards dim 0)


def write_main(out: str, ranks: int, params: int, tensors: int) -> None:
    """Save a `ranks`-rank FSDP2-style DCP folder at `out` with torch's own planner and writer (child)."""
    import torch
    import torch.distributed as dist
    from torch.distributed.checkpoint import FileSystemWriter
    from torch.distributed.checkpoint.default_planner import DefaultSavePlanner
    from torch.distributed.tensor import DTensor, Shard, init_device_mesh
    from torch.testing._internal.distributed.fake_pg import FakeStore

    cols = max(1, params // (ROWS * tensors))
    names = [f"layers.{i}.weight" for i in range(tensors)]
    gen = torch.Generator().manual_seed(0)
    full = {n: torch.randn(ROWS, cols, generator=gen) for n in names}
    moments = {n: (t * 0.1, t * t) for n, t in full.items()}
    rows = -(-ROWS // ranks)

    def rank_state(r: int) -> dict[str, Any]:
        mesh = init_device_mesh("cpu", (ranks,))

        def local(t: torch.Tensor) -> DTensor:
            part = t[r * rows : (r + 1) * rows]  # a view: rows are contiguous
            return DTensor.from_local(
                part, mesh, [Shard(0)], run_check=False, shape=t.shape, stride=t.stride()
            )

        state = {
            n: {"exp_avg": local(m), "exp_avg_sq": local(v), "step": torch.tensor(2.0)}
            for n, (m, v) in moments.items()
        }
        groups = [{"lr": 1e-3, "betas": (0.9, 0.999), "weight_decay": 0.0, "params": names}]
        return {
            "model": {n: local(t) for n, t in full.items()},
            "optim": {"state": state, "param_groups": groups},
        }

    planners = []
    local_plans = []
    for r in range(ranks):  # what every rank sends the coordinator; its planner keeps its state dict
        dist.init_process_group("fake", store=FakeStore(), rank=r, world_size=ranks)
        planner, writer = DefaultSavePlanner(), FileSystemWriter(out)
        planner.set_up_planner(rank_state(r), None, r == 0)
        writer.set_up_storage_writer(r == 0)
        local_plans.append(writer.prepare_local_plan(planner.create_local_plan()))
        planners.append((planner, writer))
        dist.destroy_process_group()
    coordinator, coord_writer = planners[0]
    global_plans, metadata = coordinator.create_global_plan(local_plans)
    global_plans = coord_writer.prepare_global_plan(global_plans)
    results = []
    for r, (planner, writer) in enumerate(planners):  # each rank writes its own file (no peer is asked)
        fut = writer.write_data(planner.finish_plan(global_plans[r]), planner)
        fut.wait()
        results.append(fut.value())
    coord_writer.finish(metadata, results)
    print(json.dumps({"params": tensors * ROWS * cols, "torch": torch.__version__}))


def run(argv: list[str]) -> tuple[float, float, float, int]:
    """`python ARGV` in a fresh interpreter: (wall s, CPU s, peak RSS MiB, exit status)."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, *argv], env=child_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    return wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024, os.waitstatus_to_exitcode(status)


def sweep(workdir: Path, counts: list[int], params: int, tensors: int) -> list[dict[str, float | int]]:
    rows: list[dict[str, float | int]] = []
    for n in counts:
        ckpt, out = workdir / f"dcp{n}", workdir / f"out{n}"
        shutil.rmtree(ckpt, ignore_errors=True)
        shutil.rmtree(out, ignore_errors=True)
        made = run([str(Path(__file__).resolve()), "--_write", str(ckpt), str(n), str(params), str(tensors)])
        if made[3]:
            raise SystemExit(f"the {n}-rank DCP writer failed (exit {made[3]})")
        files = sum(1 for p in ckpt.iterdir() if p.suffix == ".distcp")
        row = {"ranks": n, "files": files, "write_s": made[0], **measured(ckpt, out)}
        rows.append(row)
        print(table([row], rows[0]).splitlines()[-1], flush=True)
        shutil.rmtree(out, ignore_errors=True)
        shutil.rmtree(ckpt, ignore_errors=True)
    return rows


def table(rows: list[dict[str, float | int]], base: dict[str, float | int]) -> str:
    lines = [
        "| ranks (.distcp files) | torch's save | scan wall | scan CPU | scan xN | scan RSS | convert bf16 wall | "
        "convert CPU | convert peak RSS | verdict |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        ratio, said = verdict(r, base)  # scan CPU over the 8-file row, as ranks.py
        lines.append(
            f"| {int(r['ranks']):,} ({int(r['files']):,}) | {r['write_s']:.1f} s | {r['scan_s']:.2f} s | "
            f"{r['scan_cpu']:.2f} s | {ratio:.1f}x | {r['scan_mib']:.0f} MiB | {r['conv_s']:.2f} s | "
            f"{r['conv_cpu']:.2f} s | {r['conv_mib']:.0f} MiB | {said} |"
        )
    return "\n".join(lines)


def main() -> None:
    if len(sys.argv) == 6 and sys.argv[1] == "--_write":
        write_main(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]))
        return
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    ap.add_argument("--workdir", type=Path, default=Path("/tmp/zi-dcp-files"))
    ap.add_argument("--files", type=int, nargs="+", default=[8, 64, 256, 1024], help="ranks, one file each")
    ap.add_argument("--params", default="8M", help="model weights (each has two Adam moments beside it)")
    ap.add_argument("--tensors", type=int, default=8, help="weights the parameters are split into")
    ap.add_argument("--append", action="store_true", help="append the rows to tests/benchmarks/results.md")
    args = ap.parse_args()
    unit = {"K": 10**3, "M": 10**6, "G": 10**9}.get(args.params[-1:].upper())  # decimal, as model cards
    params = int(float(args.params[:-1]) * unit) if unit else int(args.params)
    args.workdir.mkdir(parents=True, exist_ok=True)
    load = os.getloadavg()
    rows = sweep(args.workdir, args.files, params, args.tensors)
    what = (
        "FSDP2-style DCP folder saved by torch's planner and FileSystemWriter (model + Adam moments, fp32, "
        f"{args.params} weights in {args.tensors} tensors), convert --dtype bf16"
    )
    publish("DCP file-count sweep (`tests/benchmarks/dcp_files.py`, issue 43)", what, table(rows, rows[0]), load, args.append)


if __name__ == "__main__":
    main()
