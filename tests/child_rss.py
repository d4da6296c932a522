"""Run the CLI (or any Python command) in a child and read its peak RSS from wait4, through a small launcher:
a child forked straight from pytest would inherit pytest's own high-water mark (the kernel carries it across
exec)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

_LAUNCH = (
    "import os, subprocess, sys\n"
    "p = subprocess.Popen(sys.argv[1:], stderr=subprocess.DEVNULL)\n"
    "_, status, usage = os.wait4(p.pid, 0)\n"
    "print(usage.ru_maxrss, os.waitstatus_to_exitcode(status), file=sys.stderr)\n"
)


def run_child(argv: list[str], ok: tuple[int, ...] = (0,)) -> tuple[int, str]:
    """(peak RSS in bytes, stdout) of `python ARGV` in a child; its exit code must be one of `ok`."""
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[1]))
    done = subprocess.run(
        [sys.executable, "-c", _LAUNCH, sys.executable, *argv],
        capture_output=True,
        text=True,
        env=env,
        check=True,
        timeout=300,
    )
    kib, code = done.stderr.split()[-2:]
    assert int(code) in ok, done.stderr
    return int(kib) * 1024, done.stdout


def run_cli(args: list[str], ok: tuple[int, ...] = (0,)) -> tuple[int, str]:
    """(peak RSS in bytes, stdout) of `python -m inspector ARGS`; its exit code must be one of `ok`."""
    return run_child(["-m", "inspector", *args], ok)
