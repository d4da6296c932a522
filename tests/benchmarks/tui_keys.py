"""Key response of the real app in a real terminal (tmux), idle and while a conversion runs.

    python tests/benchmarks/tui_keys.py CHECKPOINT [--size 80x24 --size 160x48] [--rounds 20]

Starts `zero-inspector CHECKPOINT --out TMP --dtype fp32 --overwrite` in a detached tmux session of that
size, waits for the tag to show, then times keys idle (a tab switch, the help overlay opened with `?` and
closed with `escape`), after `c` while the child converts (the help overlay, and `escape` opening the
cancel dialog), and after `h` while the Health tab's pass reads (the help overlay): from `tmux send-keys` until `tmux capture-pane` shows the change. Polled every 5 ms: each poll
starts a tmux client (~2-3 ms of CPU), so polling every millisecond kept most of one core of a 2-core
machine busy by itself. The figure includes tmux's own round trip, as a person's terminal would.
A checkpoint of at least 1B parameters makes the conversion outlast the rounds:
`zero-inspector demo /tmp/demo1b --params 1B`.
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HELP_MARK = "zero-inspector keys"
SESSION = "zi-keys-bench"
GAP = 0.3  # seconds between keys, a quick typist; also lets the tab underline finish its animation


def tmux(*args: str) -> str:
    return subprocess.run(["tmux", *args], capture_output=True, text=True, check=False).stdout


def screen() -> str:
    return tmux("capture-pane", "-p", "-t", SESSION)


POLL = 0.005


def wait_for(pred: object, timeout: float, poll: float = POLL) -> float:
    """Seconds until `pred(screen())` holds; raises after `timeout`."""
    t0 = time.perf_counter()
    while True:
        if pred(screen()):  # type: ignore[operator]
            return time.perf_counter() - t0
        if time.perf_counter() - t0 > timeout:
            raise TimeoutError(screen())
        time.sleep(poll)


# (name, key that opens, text that shows it, key that closes)
IDLE_PAIRS = [
    ("tab switch", "t", " params · ", "o"),
    ("help overlay", "?", HELP_MARK, "Escape"),
]
BUSY_PAIRS = [
    ("help overlay", "?", HELP_MARK, "Escape"),
    ("cancel dialog", "Escape", "Cancel the conversion?", "Escape"),
]


HEALTH_PAIRS = [
    ("help overlay", "?", HELP_MARK, "Escape"),
]


def round_trip(pairs: list[tuple[str, str, str, str]], rounds: int, still: object = None) -> dict[str, list[float]]:
    """Press each pair's opening and closing key `rounds` times; milliseconds until each shows."""
    out: dict[str, list[float]] = {f"{name} {k}": [] for name, key, _, back in pairs for k in (key, back)}
    for _ in range(rounds):
        for name, key, mark, back in pairs:
            if still is not None and not still(screen()):  # type: ignore[operator]
                return out
            for k, shown in ((key, True), (back, False)):
                t0 = time.perf_counter()
                tmux("send-keys", "-t", SESSION, k)
                try:
                    wait_for(lambda s, m=mark, want=shown: (m in s) == want, 10)
                except TimeoutError:
                    if still is not None and not still(screen()):  # type: ignore[operator]
                        return out  # the conversion ended under the key (escape then means "back")
                    raise
                out[f"{name} {k}"].append((time.perf_counter() - t0) * 1000)
                time.sleep(GAP)
    return out


def summary(name: str, ms: list[float]) -> str:
    if not ms:
        return f"{name}: no samples"
    q = sorted(ms)
    p90 = q[min(len(q) - 1, int(len(q) * 0.9))]
    return f"{name}: n={len(q)} median {statistics.median(q):.0f} ms, p90 {p90:.0f} ms, max {q[-1]:.0f} ms"


def run(ckpt: str, size: str, rounds: int, conversions: int) -> list[str]:
    w, h = size.split("x")
    out = tempfile.mkdtemp(prefix="zi-keys-")
    shutil.rmtree(out)
    cmd = " ".join(
        shlex.quote(a) for a in [sys.executable, "-m", "inspector", ckpt, "--out", out, "--dtype", "fp32", "--overwrite"]
    )
    tmux("kill-session", "-t", SESSION)
    tmux("new-session", "-d", "-s", SESSION, "-x", w, "-y", h, f"cd {shlex.quote(os.getcwd())} && {cmd}")
    lines = [f"## {size}, load {os.getloadavg()[0]:.2f} at start"]
    try:
        opened = wait_for(lambda s: "global_step" in s or "checkpoint-" in s, 30)
        lines.append(f"launch to tag shown: {opened:.2f} s")
        time.sleep(1.0)
        for name, ms in round_trip(IDLE_PAIRS, rounds).items():
            lines.append(summary(f"idle, {name}", ms))
        busy: dict[str, list[float]] = {}
        for _ in range(conversions):  # a fast disk finishes 1B in seconds: convert again until enough samples
            tmux("send-keys", "-t", SESSION, "c")
            wait_for(lambda s: "Converting" in s and "written" in s, 60)
            for name, ms in round_trip(BUSY_PAIRS, rounds, still=lambda s: "Converting" in s and "✔ Done" not in s).items():
                busy.setdefault(name, []).extend(ms)
            wait_for(lambda s: "✔ Done" in s or "Converting" not in s, 600)
            if busy and min(len(v) for v in busy.values()) >= rounds:
                break
            if "Converting" in screen():
                tmux("send-keys", "-t", SESSION, "b")
                wait_for(lambda s: "Converting" not in s, 10)
        for name, ms in busy.items():
            lines.append(summary(f"converting, {name}", ms))
        if "Converting" in screen():
            tmux("send-keys", "-t", SESSION, "b")
            wait_for(lambda s: "Converting" not in s, 10)
        # the Health tab's pass reads in threads of the UI's own process (numpy releases the GIL)
        tmux("send-keys", "-t", SESSION, "h")
        wait_for(lambda s: "escape cancels" in s and "reading" in s, 60)
        for name, ms in round_trip(HEALTH_PAIRS, rounds, still=lambda s: "escape cancels" in s).items():
            lines.append(summary(f"health pass, {name}", ms))
        lines.append(f"load at the end: {os.getloadavg()[0]:.2f}")
    finally:
        tmux("kill-session", "-t", SESSION)
        shutil.rmtree(out, ignore_errors=True)
    return lines


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("checkpoint")
    ap.add_argument("--size", action="append", help="terminal size WxH (repeatable); default 80x24 and 160x48")
    ap.add_argument("--rounds", type=int, default=20, help="open+close pairs per key and phase")
    ap.add_argument("--conversions", type=int, default=5, help="at most this many conversions for the busy phase")
    args = ap.parse_args()
    if not shutil.which("tmux"):
        print("tmux is needed: apt-get install tmux", file=sys.stderr)
        return 2
    for size in args.size or ["80x24", "160x48"]:
        print("\n".join(run(os.path.abspath(args.checkpoint), size, args.rounds, args.conversions)), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
