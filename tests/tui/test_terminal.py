"""The app in a real pseudo-terminal, through the driver it uses for people (not the headless test driver)."""

from __future__ import annotations

import fcntl
import os
import shutil
import struct
import subprocess
import sys
import termios
import threading
import time
from pathlib import Path

import pytest

from inspector.tui.child import REPO_ROOT
from inspector.tui.driver import IDLE_WAKE, _wake_in

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="POSIX pseudo-terminals")


class Terminal:
    """A child process on a pty of a given size; collects what it draws."""

    def __init__(self, args: list[str], cols: int = 100, rows: int = 30) -> None:
        master, slave = os.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
        env = dict(os.environ, TERM="xterm-256color", PYTHONPATH=REPO_ROOT)
        env.pop("ESCDELAY", None)
        env.pop("TEXTUAL_DRIVER", None)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "inspector", *args],
            stdin=slave,
            stdout=slave,
            stderr=slave,
            env=env,
            start_new_session=True,
        )
        os.close(slave)
        self.master = master
        self.output = bytearray()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        while True:
            try:
                data = os.read(self.master, 65536)
            except OSError:
                return
            if not data:
                return
            self.output += data

    def wait_for(self, needle: bytes, since: int = 0, timeout: float = 60) -> None:
        """Until `needle` is drawn at or after byte `since` of the output (`timeout` only guards a hang)."""
        end = time.monotonic() + timeout
        while needle not in self.output[since:]:
            if time.monotonic() > end or self.proc.poll() is not None:
                raise AssertionError(f"{needle!r} never drawn; got {bytes(self.output[-2000:])!r}")
            time.sleep(0.05)

    def mark(self) -> int:
        """Where the output ends now: `wait_for(..., since=mark)` waits for a redraw after this point."""
        return len(self.output)

    def send(self, data: bytes, settle: float = 0.8) -> None:
        os.write(self.master, data)
        time.sleep(settle)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        os.close(self.master)


def test_escape_goes_back_and_q_quits_in_a_real_terminal(small_demo: Path) -> None:
    """`e` opens the export options (focus in a text field), a lone ESC goes back, `q` then quits: had ESC
    not arrived as `escape`, the `q` would be typed into the field and the app would still be running."""
    term = Terminal([str(small_demo)])
    try:
        term.wait_for(
            b" tensors"
        )  # the scan has finished (the tag alone is drawn before it): `e` opens the form
        term.send(b"e", settle=0)
        term.wait_for(b"Output folder")
        # `q` goes only once the overview is drawn again, proof that ESC arrived alone and was handled: after
        # a fixed pause a loaded machine could deliver `q` while the form still had the focus (typed into
        # the field) or in the same read as ESC (read as alt+q), and the app never quit
        mark = term.mark()
        term.send(b"\x1b", settle=0)
        term.wait_for(b"Health", since=mark)  # a tab label: drawn with the main screen at any size
        term.send(b"q", settle=0)
        assert term.proc.wait(timeout=20) == 0, bytes(term.output[-2000:])
        assert b"Traceback" not in term.output
    finally:
        term.close()


def test_the_input_loop_wakes_when_the_escape_wait_ends() -> None:
    class Parser:
        _timeout_time: float | None = None

    p = Parser()
    assert _wake_in(p, now=5.0) == IDLE_WAKE  # nothing pending: Textual's own 100 ms
    p._timeout_time = 5.03
    assert _wake_in(p, now=5.0) == pytest.approx(0.03)
    assert _wake_in(p, now=6.0) == 0.0  # overdue: do not block at all
    assert _wake_in(object(), now=5.0) == IDLE_WAKE  # a Textual without the attribute: stock behaviour


EVIL = "\x1b]2;PWNED\x07\x1b[2J\x9b31m"  # set the title, clear the screen, a C1 CSI


def test_folder_names_with_terminal_escapes_never_reach_the_terminal_raw(
    small_demo: Path, tmp_path: Path
) -> None:
    """A folder named with escape sequences (in the path opened, and beside the runs the chooser lists) is
    shown escaped on every screen: header, status, chooser (`r`), error dialog; the raw bytes never arrive."""
    parent = tmp_path / f"runs{EVIL}"
    for run in ("run_a", "run_b", f"run{EVIL}"):
        shutil.copytree(small_demo, parent / run)
    term = Terminal([str(parent)], cols=200, rows=36)
    try:
        term.wait_for(b"global_step")
        term.send(b"r")
        term.send(b"\x1b")
        term.send(b"q", settle=0)
        assert term.proc.wait(timeout=20) == 0, bytes(term.output[-2000:])
        assert b"run_b" in term.output  # the chooser was drawn (the escaped header: test_as_used)
        assert b"PWNED\x07" not in term.output and b"\x1b]2;PWNED" not in term.output
        assert EVIL.encode() not in term.output and "\x9b31m".encode() not in term.output
    finally:
        term.close()


def test_a_missing_folder_with_escapes_is_refused_escaped(tmp_path: Path) -> None:
    """The error for a path that does not exist names it escaped (on the terminal, before any screen)."""
    term = Terminal([str(tmp_path / f"gone{EVIL}")])
    try:
        term.proc.wait(timeout=30)
        assert b"PWNED\x07" not in term.output and b"\x1b]2;PWNED" not in term.output
        assert b"does not exist" in term.output
    finally:
        term.close()
