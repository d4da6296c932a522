#!/usr/bin/env python
"""Start-up to the first byte written: a fresh `python -m inspector convert` until its first shard exists.

The engine creates the `*.partial` shard, reserves its size and writes the header before any tensor data,
so the moment the file appears is the moment the first byte is written. Polled every millisecond; the
median of several runs is printed as JSON.

    python tests/benchmarks/first_byte.py CHECKPOINT [--runs 5] [--dtype bf16]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def once(ckpt: str, dtype: str, work: Path) -> tuple[float, float]:
    out = work / "out"
    shutil.rmtree(out, ignore_errors=True)
    env = dict(os.environ, PYTHONPATH=str(REPO))
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, "-m", "inspector", "convert", ckpt, str(out), "--dtype", dtype],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env=env,
    )
    first = None
    while proc.poll() is None:
        if first is None and out.is_dir() and any(n.endswith(".partial") for n in os.listdir(out)):
            first = time.perf_counter() - t0
        time.sleep(0.001)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(proc.stderr.read().decode() if proc.stderr else f"exit {proc.returncode}")
    return (first if first is not None else wall), wall


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("checkpoint")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--dtype", default="bf16")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="zi-first-byte-"))
    try:
        once(args.checkpoint, args.dtype, work)  # warm the page cache and the bytecode cache
        runs = [once(args.checkpoint, args.dtype, work) for _ in range(args.runs)]
    finally:
        shutil.rmtree(work, ignore_errors=True)
    firsts = [f for f, _ in runs]
    print(
        json.dumps(
            {
                "first_byte_s_median": round(statistics.median(firsts), 3),
                "first_byte_s": [round(f, 3) for f in firsts],
                "wall_s": [round(w, 3) for _, w in runs],
            }
        )
    )


if __name__ == "__main__":
    main()
