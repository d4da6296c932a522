"""A universal export's workers share one memory budget: its peak RSS does not grow with the worker count.

Each run is a fresh child process (its own VmHWM) writing the same export with 2, 16 and 64 workers on this
machine, whatever its cores. Memory is deterministic enough to bound; time is not measured here."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

from inspector.demo.writer import DemoSpec

MiB = 1 << 20
SPEC = DemoSpec(stage=2, world_size=2, dtype="bf16", params=20_000_000)  # files of 1-4 MiB of fp32 each
ROOT = Path(__file__).resolve().parents[3]
CHILD = """
import sys
from inspector.system.malloc import cap_malloc_arenas
cap_malloc_arenas()  # as the CLI does, before any thread
from inspector.convert.executor import execute
from inspector.convert.kinds import Request, get
from inspector.convert.options import ConvertOptions
from inspector.scan.scanner import scan
ckpt, out, workers = sys.argv[1], sys.argv[2], int(sys.argv[3])
report = execute(get("universal").plan(scan(ckpt), Request(ConvertOptions(workers=workers)), out))
status = open("/proc/self/status").read().split("VmHWM:")[1]
print(report.tensors, int(status.split()[0]) * 1024)
"""


def _peak(ckpt: Path, out: Path, workers: int) -> int:
    done = subprocess.run(
        [sys.executable, "-c", CHILD, str(ckpt), str(out), str(workers)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
        timeout=600,
    )
    assert done.returncode == 0, done.stderr
    tensors, peak = map(int, done.stdout.split())
    assert tensors > 0
    return peak


def test_universal_peak_rss_is_flat_in_the_worker_count(demo: Any, tmp_path: Path) -> None:
    ckpt = demo(SPEC)
    peaks = {n: _peak(ckpt, tmp_path / f"w{n}", n) for n in (2, 16, 64)}
    shown = {n: f"{p / MiB:.0f} MiB" for n, p in peaks.items()}
    assert max(peaks.values()) <= 128 * MiB, shown  # the promise, at any worker count
    # flat: 64 workers within 16 MiB of 2 (each holding its own buffers cost 70 -> 176 -> 224 MiB)
    assert max(peaks.values()) - min(peaks.values()) <= 16 * MiB, shown
    same = [
        sorted(p.name for p in (tmp_path / f"w{n}" / "global_step3_uni" / "zero").rglob("*.pt"))
        for n in peaks
    ]
    assert same[0] == same[1] == same[2] and same[0]
