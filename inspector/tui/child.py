"""Run `python -m inspector convert|verify ... --progress json` as a child process and follow its events.

The child owns all the heavy work, so its memory is measured alone and a crash, `kill -9` or the OOM killer
cannot take the UI down. Two daemon threads read its stdout (JSON lines) and stderr (kept for the error
report); callbacks run on those threads, so the app turns them into messages.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

import psutil

CHILD_NICENESS = 10
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def signal_name(returncode: int) -> str | None:
    """`-9` -> "SIGKILL"; None for a normal exit."""
    if returncode >= 0:
        return None
    try:
        return signal.Signals(-returncode).name
    except ValueError:
        return f"signal {-returncode}"


class Child:
    """One child run. `on_event(dict)` for every JSON line, `on_exit(returncode, stderr_tail)` once."""

    def __init__(
        self,
        args: Sequence[str],
        on_event: Callable[[dict[str, Any]], None],
        on_exit: Callable[[int, str], None],
        stdin: str | None = None,
    ) -> None:
        self.args = [sys.executable, "-m", "inspector", *args]
        self.stdin = stdin  # what the child reads first (the conversion order), then end of input
        self._on_event = on_event
        self._on_exit = on_exit
        self._stderr: deque[str] = deque(maxlen=40)
        self.proc: subprocess.Popen[str] | None = None
        self._ps: psutil.Process | None = None
        self.peak_rss = 0
        self._stderr_done = threading.Event()

    def start(self) -> None:
        env = dict(os.environ)
        # the child imports this checkout, wherever the UI was started from
        env["PYTHONPATH"] = os.pathsep.join(p for p in (REPO_ROOT, env.get("PYTHONPATH", "")) if p)
        env["PYTHONUNBUFFERED"] = "1"
        self.proc = subprocess.Popen(
            self.args,
            stdin=subprocess.DEVNULL if self.stdin is None else subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            bufsize=1,
            env=env,
            start_new_session=True,  # the terminal's signals are the UI's, not the child's
        )
        if self.stdin is not None and self.proc.stdin is not None:
            with contextlib.suppress(OSError):  # a child that died at once is explained by its exit
                self.proc.stdin.write(self.stdin)
            with contextlib.suppress(OSError):
                self.proc.stdin.close()
        with contextlib.suppress(psutil.Error):
            self._ps = psutil.Process(self.proc.pid)
            # the UI is interactive and the converter is batch work: on a busy machine, keys win
            self._ps.nice(CHILD_NICENESS)
        threading.Thread(target=self._read_stderr, daemon=True, name="child-stderr").start()
        threading.Thread(target=self._read_stdout, daemon=True, name="child-stdout").start()

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def rss(self) -> int:
        """The child's resident memory now (0 once it has gone); also keeps the peak seen."""
        if self._ps is None or not self.running:
            return 0
        try:
            rss = int(self._ps.memory_info().rss)
        except psutil.Error:
            return 0
        self.peak_rss = max(self.peak_rss, rss)
        return rss

    def interrupt(self) -> None:
        """Ask the child to stop (SIGINT: it removes its partial output and exits 130)."""
        self._signal(signal.SIGINT)

    def pause(self) -> None:
        """Hold the child where it is (SIGSTOP) while the user answers a question about it."""
        self._signal(signal.SIGSTOP)

    def resume(self) -> None:
        self._signal(signal.SIGCONT)

    def terminate(self) -> None:
        self._signal(signal.SIGTERM)

    def kill(self) -> None:
        self._signal(signal.SIGKILL)

    def _signal(self, sig: int) -> None:
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(sig)

    def _read_stdout(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        for line in self.proc.stdout:
            line = line.strip()
            if not line.startswith("{"):
                continue
            try:
                event = json.loads(line)
            except ValueError:
                continue
            if isinstance(event, dict):
                self._on_event(event)
        rc = self.proc.wait()
        self._stderr_done.wait(5)
        self._on_exit(rc, "".join(self._stderr))

    def _read_stderr(self) -> None:
        assert self.proc is not None and self.proc.stderr is not None
        try:
            for line in self.proc.stderr:
                self._stderr.append(line)
        finally:
            self._stderr_done.set()
