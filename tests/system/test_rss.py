"""Peak RSS is this process's own: ru_maxrss survives exec, so a converter started from a big parent used to
report the parent's high-water mark (928 MiB for a real 41 MiB)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from inspector.system.rss import peak_rss

CHILD = "from inspector.system.rss import peak_rss; print(peak_rss())"
PARENT = (
    "import os, sys\n"
    "ballast = bytearray(400 << 20)\n"
    "for i in range(0, len(ballast), 4096): ballast[i] = 1\n"  # touch every page: resident
    f"os.execv(sys.executable, [sys.executable, '-c', {CHILD!r}])\n"
)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="VmHWM is Linux's")
def test_peak_after_exec_is_not_the_parents() -> None:
    out = subprocess.run([sys.executable, "-c", PARENT], capture_output=True, text=True, check=True, timeout=60)
    assert int(out.stdout) < 200 << 20, f"{int(out.stdout) >> 20} MiB: the parent's 400 MiB leaked in"


def test_peak_is_at_least_what_is_resident_now() -> None:
    import psutil

    assert peak_rss() >= psutil.Process().memory_info().rss * 0.9
