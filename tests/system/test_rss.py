"""Peak RSS is this process's own: ru_maxrss survives exec, so a converter started from a big parent used to
report the parent's high-water mark (928 MiB for a real 41 MiB). The process-tree probe and the sampler
see a child's allocation."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from inspector.system.rss import MemorySampler, current_rss, peak_rss, process_tree_rss

MiB = 2**20

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


def test_current_rss_is_psutils_figure_without_importing_it() -> None:
    """On Linux /proc/self/statm, the file psutil reads there, so a convert's start-up skips psutil."""
    code = (
        "import sys; from inspector.system.rss import current_rss, peak_rss; now = current_rss(); "
        "peak_rss(); print('psutil' in sys.modules); import psutil; "
        "print(abs(now - psutil.Process().memory_info().rss) < 8 << 20)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    loaded, close = out.stdout.split()
    assert close == "True"
    if sys.platform.startswith("linux"):
        assert loaded == "False"


# --------------------------------------------------------------------------------------------------------------
# RSS
# --------------------------------------------------------------------------------------------------------------

ALLOC_MB = 200
CHILD_CODE = (
    "import sys\n"
    f"b = b'\\x01' * ({ALLOC_MB} << 20)\n"  # non-zero bytes: every page is really touched
    "sys.stdout.write('ready\\n'); sys.stdout.flush()\n"
    "sys.stdin.read()\n"  # hold the memory until the test closes stdin
)


@pytest.fixture
def spawn_allocator() -> Iterator[list[subprocess.Popen[str]]]:
    procs: list[subprocess.Popen[str]] = []
    yield procs
    for p in procs:
        if p.stdin:
            p.stdin.close()
        try:
            p.wait(timeout=5)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def _start(procs: list[subprocess.Popen[str]]) -> subprocess.Popen[str]:
    p = subprocess.Popen(
        [sys.executable, "-c", CHILD_CODE], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    procs.append(p)
    return p


def _wait_ready(p: subprocess.Popen[str]) -> None:
    assert p.stdout is not None
    assert p.stdout.readline().strip() == "ready"


def test_process_tree_rss_counts_children(spawn_allocator: list[subprocess.Popen[str]]) -> None:
    child = _start(spawn_allocator)
    _wait_ready(child)
    assert process_tree_rss(child.pid) >= 150 * MiB
    own = current_rss()
    tree = process_tree_rss()
    assert tree - own >= 150 * MiB
    assert process_tree_rss(os.getpid()) - own >= 150 * MiB


def test_process_tree_rss_vanished_pid_is_zero() -> None:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    assert process_tree_rss(p.pid) == 0


def test_current_and_peak_rss() -> None:
    before = current_rss()
    block = b"\x02" * (64 * MiB)
    after = current_rss()
    assert after - before >= 48 * MiB
    assert peak_rss() >= after - 4 * MiB  # ru_maxrss has page/KiB granularity
    del block


def test_sampler_sees_child_allocation(spawn_allocator: list[subprocess.Popen[str]]) -> None:
    sampler = MemorySampler(interval=0.02, refresh_children=0.1)
    with sampler:
        child = _start(spawn_allocator)
        _wait_ready(child)
        deadline = time.monotonic() + 5
        while sampler.peak - sampler.baseline < 150 * MiB and time.monotonic() < deadline:
            time.sleep(0.02)
        assert sampler.running
    assert not sampler.running
    assert sampler.peak_delta >= 150 * MiB
    assert sampler.samples >= 3
    assert sampler.peak >= sampler.last > 0


def test_sampler_without_children_ignores_child(spawn_allocator: list[subprocess.Popen[str]]) -> None:
    sampler = MemorySampler(interval=0.02, include_children=False).start()
    child = _start(spawn_allocator)
    _wait_ready(child)
    time.sleep(0.1)
    sampler.stop()
    assert sampler.peak_delta < 100 * MiB


def test_sampler_on_exiting_process_finishes() -> None:
    p = subprocess.Popen(
        [sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE, text=True
    )
    sampler = MemorySampler(p.pid, interval=0.01).start()
    assert sampler.peak > 0
    assert p.stdin is not None
    p.stdin.close()
    p.wait()
    deadline = time.monotonic() + 3
    while sampler.running and time.monotonic() < deadline:
        time.sleep(0.01)
    assert sampler.finished and not sampler.running
    assert sampler.last == 0 and sampler.peak > 0
    sampler.stop()


def test_sampler_rejects_bad_interval_and_double_start() -> None:
    with pytest.raises(ValueError):
        MemorySampler(interval=0)
    s = MemorySampler(interval=0.05).start()
    try:
        with pytest.raises(RuntimeError):
            s.start()
    finally:
        s.stop()
