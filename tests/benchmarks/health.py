#!/usr/bin/env python
"""Benchmark `zero-inspector health` against the I/O floor and against torch.load + the same statistics.

On one demo checkpoint (default: 500M parameters, ZeRO-2, bf16, 2 ranks) this script runs, each in a fresh
process:

* floor:  exactly the byte ranges the health pass reads (masters, both moments, the 16-bit copy, frozen
          parameters and buffers), `preadv` into one reused 16 MiB buffer, one thread, in file order;
* floor_n: the same ranges on as many threads as the health pass uses, whole ranges largest first, 2 MiB
          buffers (on a cold cache the disk may serve several readers faster than one);
* health: `python -m inspector health ROOT --json` (scan included);
* torch:  `torch.load` of every rank file (weights_only=False: the optimizer files hold DeepSpeed classes, so
          deepspeed must be installed), then the same statistics (NaN, ±Inf, zeros, min, max, mean, std, L2
          norm in float64) over the same elements: each fp32 partition, both moments and the module copy.

and records each child's wall time, CPU time and peak RSS (from wait4). The page cache is warmed before every
run with the same read, or with `--cold` emptied of the checkpoint's pages. It prints a markdown section; with
`--append` it adds it to tests/benchmarks/results.md.

    python tests/benchmarks/health.py --workdir /tmp/zi-health-bench            # 500M, ~7 GiB on disk
    python tests/benchmarks/health.py --params 50M --runs 1                      # a quick look
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import os
import platform
import statistics
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
if importlib.util.find_spec("inspector") is None:  # a checkout without an install
    sys.path.insert(0, str(REPO))

MiB = 1024 * 1024


def _ranges(root: str) -> list[tuple[str, int, int]]:
    """(file, offset, nbytes) of every stream the health pass reads, in file order."""
    from inspector.convert.options import ConvertOptions, select
    from inspector.health.stream import plan_jobs
    from inspector.scan.scanner import scan

    ckpt = scan(root)
    jobs = plan_jobs(ckpt, select(ckpt, ConvertOptions()), None)
    segs = [s for j in jobs for s in (*j.segments, *j.module)]
    return sorted((s.file, s.offset, s.nbytes) for s in segs)


def child_floor(root: str, threads: int = 1) -> dict[str, Any]:
    """Read the ranges: one thread in file order through one 16 MiB buffer, or `threads` threads taking
    whole ranges, largest first, through 2 MiB buffers (the health pass's own pattern and chunk size)."""
    from inspector.convert.reader import buffer

    ranges = _ranges(root)
    t0 = time.perf_counter()
    fds = {path: os.open(path, os.O_RDONLY) for path in {r[0] for r in ranges}}
    local = threading.local()
    size = 16 * MiB if threads == 1 else 2 * MiB

    def read(item: tuple[str, int, int]) -> int:
        path, off, n = item
        view = getattr(local, "view", None)
        if view is None:
            view = local.view = memoryview(buffer(size))  # on a page, as the health pass's buffers
        fd, total = fds[path], 0
        while n:
            got = os.preadv(fd, [view[: min(n, size)]], off)
            if got <= 0:
                raise OSError(f"short read in {path}")
            off, n, total = off + got, n - got, total + got
        return total

    if threads == 1:
        total = sum(map(read, ranges))
    else:
        with ThreadPoolExecutor(threads) as ex:
            total = sum(ex.map(read, sorted(ranges, key=lambda r: -r[2])))
    for fd in fds.values():
        os.close(fd)
    return {"bytes": total, "seconds": time.perf_counter() - t0}


def child_torch(root: str) -> dict[str, Any]:
    import torch

    t0 = time.perf_counter()
    tag = (Path(root) / "latest").read_text().strip()
    elems = 0
    results = []

    def stats(t: torch.Tensor) -> None:
        nonlocal elems
        x = t.detach().reshape(-1).double()
        fin = x[torch.isfinite(x)]
        results.append(
            (
                int(torch.isnan(x).sum()),
                int(torch.isposinf(x).sum()),
                int(torch.isneginf(x).sum()),
                int((x == 0).sum()),
                float(fin.min()),
                float(fin.max()),
                float(fin.mean()),
                float(fin.std(correction=0)),
                float(torch.linalg.vector_norm(fin)),
            )
        )
        elems += x.numel()

    for f in sorted((Path(root) / tag).glob("*.pt")):
        sd = torch.load(f, map_location="cpu", weights_only=False)
        if "optimizer_state_dict" in sd:
            osd = sd["optimizer_state_dict"]
            for t in osd.get("single_partition_of_fp32_groups", []) or osd.get("fp32_flat_groups", []):
                stats(t)
            for st in osd["base_optimizer_state"]["state"].values():
                stats(st["exp_avg"])
                stats(st["exp_avg_sq"])
        for t in (sd.get("module") or {}).values():
            if isinstance(t, torch.Tensor) and t.is_floating_point() and t.numel():
                stats(t)
        del sd
    return {"elements": elems, "tensors": len(results), "seconds": time.perf_counter() - t0}


def _run(argv: list[str]) -> tuple[float, int, str, float]:
    """(wall seconds, peak RSS bytes of the child, stdout, CPU seconds of the child: user + system)."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=REPO)
    out = proc.stdout.read() if proc.stdout else b""
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    err = proc.stderr.read() if proc.stderr else b""
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode not in (0, 1):
        raise RuntimeError(f"{argv} failed ({proc.returncode}): {err.decode()[-2000:]}")
    return wall, usage.ru_maxrss * 1024, out.decode(), usage.ru_utime + usage.ru_stime


def _warm(root: str) -> None:
    subprocess.run([sys.executable, __file__, "--child", "floor", root], check=True, capture_output=True)


def _evict(root: str) -> None:
    """Drop the checkpoint's pages from the page cache (POSIX_FADV_DONTNEED: no root needed; clean pages of
    a file nobody maps go at once), so the next run reads from the disk."""
    for f in Path(root).rglob("*"):
        if f.is_file():
            fd = os.open(f, os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workdir", default="/tmp/zi-health-bench")
    ap.add_argument("--params", default="500M")
    ap.add_argument("--stage", type=int, default=2)
    ap.add_argument("--runs", type=int, default=3, help="timed runs of each (median reported)")
    ap.add_argument("--no-torch", action="store_true", help="skip the torch.load comparison")
    ap.add_argument(
        "--cold", action="store_true", help="evict the checkpoint from the page cache before every run"
    )
    ap.add_argument("--append", action="store_true", help="append the section to tests/benchmarks/results.md")
    ap.add_argument("--child", choices=("floor", "floor_n", "torch"), help=argparse.SUPPRESS)
    ap.add_argument("root", nargs="?", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child == "floor_n":
        from inspector.health.stream import plan_workers

        print(json.dumps(child_floor(args.root, plan_workers().threads)))
        return 0
    if args.child:
        fn = child_floor if args.child == "floor" else child_torch
        print(json.dumps(fn(args.root)))
        return 0

    root = Path(args.workdir) / f"demo-s{args.stage}-{args.params}"
    if not (root / "latest").exists():
        t0 = time.perf_counter()
        cmd = [sys.executable, "-m", "inspector", "demo", str(root), "--params", args.params]
        subprocess.run([*cmd, "--stage", str(args.stage), "--overwrite"], check=True, cwd=REPO)
        print(f"demo written in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    disk = sum(f.stat().st_size for f in root.rglob("*.pt"))

    kinds = ["floor", "floor_n", "health"] + ([] if args.no_torch else ["torch"])
    runs: dict[str, list[tuple[float, int]]] = {k: [] for k in kinds}
    cpu: dict[str, list[float]] = {k: [] for k in kinds}
    info: dict[str, Any] = {}
    for i in range(args.runs):
        for kind in kinds:
            (_evict if args.cold else _warm)(str(root))
            if kind == "health":
                argv = [sys.executable, "-m", "inspector", "health", str(root), "--json"]
            else:
                argv = [sys.executable, __file__, "--child", kind, str(root)]
            wall, rss, out, secs = _run(argv)
            runs[kind].append((wall, rss))
            cpu[kind].append(secs)
            doc = json.loads(
                out.strip().splitlines()[-1] if kind != "health" else out
            )  # deepspeed logs to stdout
            if kind == "health":
                info["health_bytes"] = doc["bytes_read"]
                info.setdefault("health_inner", []).append(doc["seconds"])
                info["threads"] = doc["threads"]
                info["streams"] = len(doc["tensors"])
            else:
                info[kind] = doc
            print(
                f"run {i + 1} {kind}: {wall:.2f} s, CPU {secs:.2f} s, peak RSS {rss / MiB:.0f} MiB",
                file=sys.stderr,
            )

    def med(kind: str) -> tuple[float, int]:
        w = statistics.median(r[0] for r in runs[kind])
        return w, max(r[1] for r in runs[kind])

    floor_w, floor_rss = med("floor")
    floor_n, floor_n_rss = med("floor_n")
    best = min(floor_w, floor_n)

    def row(label: str, kind: str, wall: float, rss: int, rate: bool = True) -> str:
        gbs = f"{info['health_bytes'] / wall / 1e9:.2f}" if rate else "–"
        return (
            f"| {label} | {wall:.2f} s | {wall / floor_w:.2f}× | {wall / floor_n:.2f}× | {gbs} | "
            f"{statistics.median(cpu[kind]):.2f} s | {rss / MiB:.0f} MiB |"
        )

    gib = info["health_bytes"] / 2**30
    load = os.getloadavg()
    lines = [
        f"## Health pass (`zero-inspector health`), {args.params} ZeRO-{args.stage} demo "
        f"({datetime.date.today().isoformat()})",
        "",
        f"Machine: {platform.platform()}, {os.cpu_count()} cores, load average {load[0]:.1f} when done; "
        + (
            "page cache cold before every run (the checkpoint's pages dropped with POSIX_FADV_DONTNEED)"
            if args.cold
            else "page cache warm before every run (same bytes read once)"
        )
        + f". Checkpoint {disk / 2**30:.1f} GiB on disk; the "
        f"pass reads {gib:.2f} GiB ({info['streams']} streams: masters, both moments, the 16-bit copy, frozen, "
        f"buffers) on {info['threads']} threads. Median of {args.runs} fresh processes; peak RSS is the child's "
        "ru_maxrss (max over runs).",
        "",
        f"| run | wall | × floor (1 thread) | × floor ({info['threads']} threads) | GB/s | CPU (user + sys) "
        "| peak RSS |",
        "|---|---:|---:|---:|---:|---:|---:|",
        row("I/O floor (preadv, same ranges, 1 thread, 16 MiB, file order)", "floor", floor_w, floor_rss),
        row(
            f"I/O floor (preadv, same ranges, {info['threads']} threads, 2 MiB, largest first)",
            "floor_n",
            floor_n,
            floor_n_rss,
        ),
    ]
    hw, hrss = med("health")
    lines.append(row("`zero-inspector health --json` (process, scan included)", "health", hw, hrss))
    if not args.no_torch:
        tw, trss = med("torch")
        lines.append(row("torch.load every file + the same statistics (float64)", "torch", tw, trss, False))
    inner = statistics.median(info["health_inner"])
    lines += [
        "",
        f"Health against the faster floor: {hw / best:.2f}×. Inside the processes (after imports and the "
        f"scan): the health pass {inner:.2f} s (median, from its JSON), the floors' reads "
        f"{info['floor']['seconds']:.2f} s and {info['floor_n']['seconds']:.2f} s (last run). "
        f"All runs (wall s, MiB): "
        + "; ".join(
            f"{k}: " + ", ".join(f"{w:.2f}/{r / MiB:.0f}" for w, r in v) for k, v in runs.items() if v
        )
        + ".",
        "",
    ]
    text = "\n".join(lines)
    print(text)
    if args.append:
        with open(HERE / "results.md", "a") as fh:
            fh.write("\n" + text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
