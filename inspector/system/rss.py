"""Cheap RSS measurement: one-shot probes of a process (tree) and a sampling thread for live meters."""

from __future__ import annotations

import os
import sys
import threading
import time
from types import TracebackType
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import psutil  # imported where used: a convert's start-up never needs it on Linux (~25-50 ms)

try:  # pragma: no cover - resource is missing only on Windows
    import resource
except ImportError:  # pragma: no cover
    resource = None  # type: ignore[assignment]


# --------------------------------------------------------------------------------------------------------------
# RSS
# --------------------------------------------------------------------------------------------------------------

def _gone() -> tuple[type[Exception], ...]:
    import psutil

    return (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied)


def _rss_of(proc: psutil.Process) -> int | None:
    try:
        return int(proc.memory_info().rss)
    except _gone():
        return None


def process_tree_rss(pid: int | None = None) -> int:
    """RSS of a process plus all its descendants; 0 if the process itself is gone.

    Workers (e.g. a spawned converter) count against the same budget, so the tree is what matters.
    """
    import psutil

    try:
        root = psutil.Process(os.getpid() if pid is None else pid)
        children = root.children(recursive=True)
    except _gone():
        return 0
    total = _rss_of(root)
    if total is None:
        return 0
    for child in children:
        total += _rss_of(child) or 0
    return total


def current_rss() -> int:
    """RSS of this process only: on Linux /proc/self/statm's resident pages (what psutil reads there)."""
    try:
        with open("/proc/self/statm", "rb") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        import psutil

        return int(psutil.Process().memory_info().rss)


def _vm_hwm() -> int | None:
    """This process's own RSS high-water mark (Linux `VmHWM`), in bytes, or None where there is none.

    Not getrusage's ru_maxrss: that survives exec, so a converter started from a 1 GB parent (a shell
    wrapper, a Python launcher) reported the parent's peak as its own (928 MiB for a real 41 MiB)."""
    try:
        with open("/proc/self/status", "rb") as fh:
            for line in fh:
                if line.startswith(b"VmHWM:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def peak_rss() -> int:
    """Peak RSS of this process only (children are not included); never below the current RSS (the kernel
    updates its high-water mark lazily, so a fresh reading can exceed it). Linux: VmHWM; elsewhere
    getrusage's ru_maxrss (KiB on Linux, bytes on macOS)."""
    now = current_rss()
    hwm = _vm_hwm()
    if hwm is not None:
        return max(now, hwm)
    if resource is None:  # pragma: no cover - Windows
        import psutil

        return max(now, int(getattr(psutil.Process().memory_info(), "peak_wset", now)))
    maxrss = int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
    return max(now, maxrss if sys.platform == "darwin" else maxrss * 1024)


class MemorySampler:
    """Samples the RSS of a process tree in a daemon thread, keeping ``peak`` and ``last``.

    Finding descendants scans every process on the machine, so the child list is only refreshed every
    ``refresh_children`` seconds; each tick just reads statm of the known processes (~20 us each).
    """

    def __init__(
        self,
        pid: int | None = None,
        interval: float = 0.05,
        *,
        include_children: bool = True,
        refresh_children: float = 0.5,
    ) -> None:
        if interval <= 0:
            raise ValueError(f"interval must be positive, got {interval}")
        self.pid: int = os.getpid() if pid is None else pid
        self.interval = interval
        self.include_children = include_children
        self.refresh_children = refresh_children
        self.baseline: int = 0
        self.peak: int = 0
        self.last: int = 0
        self.samples: int = 0
        self.finished: bool = False  # the sampled process has exited
        self._root: psutil.Process | None = None
        self._children: list[psutil.Process] = []
        self._children_at: float = float("-inf")  # monotonic time of the last child scan
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- sampling --------------------------------------------------------------------------------------------

    def _tree_rss(self) -> int | None:
        if self._root is None:
            import psutil

            try:
                self._root = psutil.Process(self.pid)
            except _gone():
                return None
        root_rss = _rss_of(self._root)
        if root_rss is None:
            return None
        if not self.include_children:
            return root_rss
        now = time.monotonic()
        if now - self._children_at >= self.refresh_children:
            try:
                self._children = self._root.children(recursive=True)
            except _gone():
                return None
            self._children_at = now
        total = root_rss
        alive: list[psutil.Process] = []
        for child in self._children:
            rss = _rss_of(child)
            if rss is not None:
                total += rss
                alive.append(child)
        self._children = alive
        return total

    def sample(self) -> int:
        """Take one sample now and return it (also used by start/stop so short runs are never missed)."""
        with self._lock:
            rss = self._tree_rss()
            if rss is None:
                self.finished = True
                self.last = 0
                return 0
            if self.samples == 0:
                self.baseline = rss
            self.samples += 1
            self.last = rss
            self.peak = max(self.peak, rss)
            return rss

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.sample()
            if self.finished:
                return

    # -- lifecycle -------------------------------------------------------------------------------------------

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self) -> MemorySampler:
        """Begin sampling in the background; the first sample is taken synchronously."""
        if self._thread is not None:
            raise RuntimeError("MemorySampler can only be started once")
        self.sample()
        self._thread = threading.Thread(target=self._run, name=f"memory-sampler-{self.pid}", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> int:
        """Stop sampling, take a final sample, and return the peak."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        if not self.finished:
            self.sample()
        return self.peak

    @property
    def peak_delta(self) -> int:
        """Growth of the peak over the first sample: what the sampled work itself added."""
        return max(0, self.peak - self.baseline)

    def __enter__(self) -> MemorySampler:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
