#!/usr/bin/env python
"""Many tiny tensors: scan, preflight, convert, verify and health on a checkpoint whose model states hold N
one-element buffers (each its own storage record), wall time and peak RSS per command, for each N given.

    python tests/benchmarks/scale.py --tensors 100000,1000000 [--workdir DIR] [--commands scan,convert]

The checkpoint is a small demo with the buffers added through torch (torch is needed here, never by the
tool). Prints one JSON line per (N, command); tests/benchmarks/results.md keeps the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))


def build(root: Path, n: int) -> Path:
    from tests.scan.test_scale import with_buffers

    return with_buffers(root, n, params=200_000)


def run(argv: list[str], timeout: float) -> dict[str, object]:
    """One command in a fresh interpreter: wall seconds, exit status and that child's own peak RSS (MiB)."""
    env = dict(os.environ, PYTHONPATH=str(REPO))
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, "-m", "inspector", *argv],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    while True:
        pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            break
        if time.perf_counter() - t0 > timeout:
            proc.kill()
            _, status, usage = os.wait4(proc.pid, 0)
            return {"rc": f"timeout {timeout:.0f} s", "seconds": round(timeout), "peak_rss_mib": None}
        time.sleep(0.05)
    proc.returncode = os.waitstatus_to_exitcode(status)
    wall = time.perf_counter() - t0
    return {
        "rc": proc.returncode,
        "seconds": round(wall, 2),
        "peak_rss_mib": round(usage.ru_maxrss / 1024, 1),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tensors", default="100000", help="comma-separated counts of tiny buffers")
    ap.add_argument("--workdir", default=None)
    ap.add_argument("--timeout", type=float, default=1800)
    ap.add_argument("--commands", default="scan,preflight,convert,verify,health")
    ap.add_argument("--build", nargs=2, metavar=("N", "ROOT"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.build:
        build(Path(args.build[1]), int(args.build[0]))
        return
    work = Path(args.workdir or tempfile.mkdtemp(prefix="zi-scale-"))
    for n in (int(x) for x in args.tensors.split(",")):
        root = work / f"n{n}"
        shutil.rmtree(root, ignore_errors=True)
        t0 = time.perf_counter()
        # built in a child: torch's memory must not be this process's, whose peak each command's child inherits
        subprocess.run([sys.executable, __file__, "--build", str(n), str(root)], check=True)
        size = sum(p.stat().st_size for p in root.rglob("*") if p.is_file())
        print(json.dumps({"tensors": n, "build_seconds": round(time.perf_counter() - t0, 1), "bytes": size}))
        out = work / f"out{n}"
        shutil.rmtree(out, ignore_errors=True)
        for argv in (
            ["scan", str(root), "--json"],
            ["preflight", str(root), "--json"],
            ["convert", str(root), str(out)],
            ["verify", str(root), str(out)],
            ["health", str(root), "--json"],
        ):
            if argv[0] not in args.commands.split(","):
                continue
            print(json.dumps({"tensors": n, "command": argv[0], **run(argv, args.timeout)}), flush=True)
        shutil.rmtree(root, ignore_errors=True)
        shutil.rmtree(out, ignore_errors=True)


if __name__ == "__main__":
    main()
