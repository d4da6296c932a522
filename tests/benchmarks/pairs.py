#!/usr/bin/env python
"""Paired, interleaved runs of `convert --dtype bf16` against DeepSpeed's `zero_to_torch` on one checkpoint
(issue 43: ZeRO-3 at <= 0.30x DeepSpeed's time), for a machine under load where single runs mislead.

    python tests/benchmarks/pairs.py CKPT --pairs 5                      # ours and DeepSpeed, alternating
    python tests/benchmarks/pairs.py CKPT --base /tmp/base-tree          # also an older tree of ours

Each pair runs both tools back to back in fresh processes, the order alternating from pair to pair (half
of our runs come right after DeepSpeed's 1 GB output was written, half before), each measured by wait4:
wall, user and system CPU and its own peak RSS (system time swings most with the machine's load:
reclaim, dirty-page throttling). The page cache is warmed once before the first pair. The
table gives every run and the medians, and each pair's ratio of wall to DeepSpeed's (the median of pairs is
the figure). Timings are not tests; the load average goes with the rows.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from children import child_env  # the script's folder is on the path

REPO = Path(__file__).resolve().parents[2]


def run(argv: list[str], pythonpath: str) -> tuple[float, float, float, float]:
    """`python ARGV` in a fresh interpreter: (wall s, user CPU s, system CPU s, peak RSS MiB)."""
    # our bytecode compiled, as installed (`children.py`)
    env = dict(child_env(), PYTHONPATH=pythonpath, DS_ACCELERATOR="cpu")
    with tempfile.TemporaryFile() as err:  # a file, not a pipe: a chatty child never blocks on it
        t0 = time.perf_counter()
        # run inside the tree: `python -m` puts the working folder ahead of PYTHONPATH
        proc = subprocess.Popen(
            [sys.executable, *argv], env=env, cwd=pythonpath, stdout=subprocess.DEVNULL, stderr=err
        )
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - t0
        code = os.waitstatus_to_exitcode(status)
        if code:
            err.seek(0)
            raise SystemExit(f"{' '.join(argv[:3])} failed (exit {code}):\n{err.read()[-2000:].decode()}")
    return wall, usage.ru_utime, usage.ru_stime, usage.ru_maxrss / 1024


def warm(root: Path) -> None:
    for p in root.rglob("*"):
        if p.is_file():
            with p.open("rb") as f:
                while f.read(1 << 24):
                    pass


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    ap.add_argument("ckpt", type=Path)
    ap.add_argument("--pairs", type=int, default=5)
    ap.add_argument("--out", type=Path, default=None, help="output folder (default: beside the checkpoint)")
    ap.add_argument("--base", default=None, help="a folder holding an older `inspector` package to run too")
    ap.add_argument("--shard-size", default="1GB")
    args = ap.parse_args()
    out = args.out or args.ckpt.parent / f"pairs-out-{args.ckpt.name}"
    tools = {
        "ours": (["-m", "inspector", "convert", str(args.ckpt), str(out), "--dtype", "bf16",
                  "--shard-size", args.shard_size], str(REPO)),
        "deepspeed": (["-m", "deepspeed.utils.zero_to_torch", str(args.ckpt), str(out), "--dtype", "bf16",
                       "--max_shard_size", args.shard_size, "--safe_serialization"], str(REPO)),
    }  # fmt: skip
    if args.base:
        tools["ours-base"] = (tools["ours"][0], args.base)
    warm(args.ckpt)
    load = os.getloadavg()[0]
    rows: dict[str, list[tuple[float, float, float, float]]] = {k: [] for k in tools}
    names = list(tools)
    for i in range(args.pairs):
        order = names if i % 2 == 0 else names[::-1]
        for name in order:
            shutil.rmtree(out, ignore_errors=True)
            rows[name].append(run(*tools[name]))
        shutil.rmtree(out, ignore_errors=True)
        cells = "  ".join(
            f"{n} {rows[n][-1][0]:.2f} s ({rows[n][-1][1]:.2f} + {rows[n][-1][2]:.2f})" for n in names
        )
        print(f"pair {i + 1}: {' -> '.join(order)}: {cells}", flush=True)
    print(
        f"\nload average {load:.1f} at the start, {os.getloadavg()[0]:.1f} at the end; {args.pairs} pairs\n"
    )
    print(
        "| tool | wall median (min-max) | user CPU median | system CPU median | peak RSS median | wall / DeepSpeed's |"
    )
    print("|---|---|---|---|---|---|")
    for n in names:
        walls = [r[0] for r in rows[n]]
        ratio = statistics.median(a[0] / b[0] for a, b in zip(rows[n], rows["deepspeed"], strict=True))
        print(
            f"| {n} | {statistics.median(walls):.2f} s ({min(walls):.2f}-{max(walls):.2f}) | "
            f"{statistics.median(r[1] for r in rows[n]):.2f} s | {statistics.median(r[2] for r in rows[n]):.2f} s | "
            f"{statistics.median(r[3] for r in rows[n]):.0f} MiB | {ratio:.2f}x |"
        )


if __name__ == "__main__":
    main()
