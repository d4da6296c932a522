#!/usr/bin/env python
"""Sweep the worker count: health and convert (weights bf16, fp32, universal) against the read floor on as
many threads, page cache warm and cold, each run a fresh process measured by wait4 (wall, CPU, peak RSS).

For N in 1, 2, 4, 8, 16 workers and both cache states (cold: the checkpoint's pages dropped with
POSIX_FADV_DONTNEED before the run; warm: every file read once before it), preflight asked first, then each
command run once unmeasured (`--warmup`) just before the floor and the run, each following the last within a
second, so that they find the machine's memory alike:

* floor:   N threads read exactly the byte ranges the command reads (whole ranges, largest first, 1 MiB
           buffers) and, for a conversion, pwrite as many bytes as it writes: the I/O alone;
* health:  `python -m inspector health ROOT --json --workers N` (its pass: the report's `seconds`);
* convert: `python -m inspector convert ROOT OUT --format weights --dtype bf16|fp32 --workers N`, and
           `--format universal`; the conversion phase is the engine's own time (its JSON report's `seconds`).

The rows go into tests/benchmarks/results.md (`--append`) with the machine's core count, each judged against
the targets of issue 30 (FAIL where one is missed):

* health: its pass <= 1.5 x the N-thread floor warm, <= 1.2 x cold; never slower with more workers (10 % noise);
* convert: conversion phase <= 1.3 x the floor, whole process <= 1.5 x;
* every command <= 128 MiB peak RSS at every worker count;
* preflight's time (convert's and universal's `assess`, health's `health.estimate`, the one calibrated model,
  asked in a child just before the run, in the same cache state) within 25 % of the run's whole-process wall;
* CPU busy >= 0.8 x min(N, cores) during health's pass and the casting conversion's phase (bf16): the CPU
  the child's /proc/PID/stat shows over the busiest stretch as long as the phase, sampled every 10 ms.

    python tests/benchmarks/sweep.py --workdir /tmp/zi-sweep --append         # a 500M ZeRO-2 demo, ~7 GB
    python tests/benchmarks/sweep.py --root CKPT --workers 2 16 --cache warm   # a quick look

The parent imports nothing heavy: a child's peak RSS from wait4 starts at its parent's (the kernel carries
the high-water mark across exec), so the figures are the commands' own.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import itertools
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from children import child_env  # the script's folder is on the path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
MiB = 1 << 20
COMMANDS = ("health", "bf16", "fp32", "universal")
CASTING = ("health", "bf16")  # the work that must keep N cores busy


def _env() -> dict[str, str]:
    return child_env()  # bytecode compiled once, as installed (`children.py`)


TICK = os.sysconf("SC_CLK_TCK")


def _cpu_of(pid: int) -> float | None:
    """CPU-seconds (user + sys, every thread's, the ended ones' too) of a live or not yet reaped child."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return (int(fields[11]) + int(fields[12])) / TICK  # utime, stime: fields 14 and 15 of stat(5)


def _measure(argv: list[str]) -> dict[str, Any]:
    """Run `argv` as a child: wall, CPU (user + sys) and peak RSS from wait4, its stdout, and its CPU-seconds
    sampled every 10 ms (for the cores it kept busy during its phase, `busiest`)."""
    import threading

    start = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=_env(), cwd=REPO)
    assert proc.stdout is not None
    samples: list[tuple[float, float]] = []
    ended = threading.Event()

    def sample() -> None:
        while not ended.is_set():
            cpu = _cpu_of(proc.pid)
            if cpu is not None:
                samples.append((time.perf_counter() - start, cpu))
            ended.wait(0.01)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    out = proc.stdout.read().decode()
    ended.set()  # stdout closed: the child is exiting; its last sample is read before it is reaped
    sampler.join()
    last = _cpu_of(proc.pid)
    if last is not None:
        samples.append((time.perf_counter() - start, last))
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    code = os.waitstatus_to_exitcode(status)
    return {
        "wall": wall,
        "cpu": usage.ru_utime + usage.ru_stime,
        "rss": usage.ru_maxrss * 1024,
        "code": code,
        "out": out,
        "samples": samples,
    }


def busiest(samples: list[tuple[float, float]], span: float) -> float | None:
    """Cores kept busy over the busiest stretch of `span` seconds (the phase's length): the phase itself,
    whose threads outwork the one-threaded start-up and exit around it. CPU between samples is taken as
    spread evenly; None when the samples do not cover `span` (a run too short to tell)."""
    if not samples or span <= 0 or samples[-1][0] - samples[0][0] < span:
        return None

    def cpu_at(t: float) -> float:
        for (t0, c0), (t1, c1) in itertools.pairwise(samples):
            if t0 <= t <= t1:
                return c0 + (c1 - c0) * ((t - t0) / (t1 - t0) if t1 > t0 else 1.0)
        return samples[-1][1]

    best = 0.0
    for t, c in samples:
        if t + span > samples[-1][0]:
            break
        best = max(best, cpu_at(t + span) - c)
    return best / span


# --- children (run in their own process, so the parent stays small) ---------------------------------------


def _ranges(root: str, what: str) -> tuple[list[tuple[str, int, int]], int]:
    """(file, offset, nbytes) the command reads, and the bytes it writes."""
    sys.path.insert(0, str(REPO))
    from inspector.convert.kinds import get
    from inspector.convert.kinds.base import Request
    from inspector.convert.options import ConvertOptions, select
    from inspector.convert.plan import build_plan
    from inspector.health.stream import plan_jobs
    from inspector.scan.scanner import scan

    ckpt = scan(root)
    if what == "health":
        jobs = plan_jobs(ckpt, select(ckpt, ConvertOptions()), None)
        return [(s.file, s.offset, s.nbytes) for j in jobs for s in (*j.segments, *j.module)], 0
    if what == "universal":  # the fp32 masters and both moments, written as one file each
        jobs = [j for j in plan_jobs(ckpt, select(ckpt, ConvertOptions()), None) if j.source != "module"]
        job = get("universal").plan(ckpt, Request(), "/tmp/zi-sweep-plan")
        return [(s.file, s.offset, s.nbytes) for j in jobs for s in j.segments], job.output_bytes
    plan = build_plan(ckpt, ConvertOptions(dtype=what))
    segs = [s for sh in plan.shards for t in sh.tensors for s in t.segments]
    return [(s.file, s.offset, s.nbytes) for s in segs], plan.output_bytes


def child_predict(root: str, what: str, workers: int, out_dir: str) -> None:
    """Print preflight's time for the command on `workers` (the calibrated model, this machine, now)."""
    sys.path.insert(0, str(REPO))
    import inspector.convert.calibrate as calibration
    from inspector.convert.kinds import get
    from inspector.convert.kinds.base import Request
    from inspector.convert.options import ConvertOptions, select
    from inspector.health.estimate import health_seconds
    from inspector.scan.scanner import scan

    model: dict[str, Any] = {}  # what the model was given, for tests/benchmarks/fit_preflight.py
    real = calibration.estimate_seconds

    def spy(cal: Any, n: int, work: Any) -> float:
        model.update(cal=dataclasses.asdict(cal), workers=n, work=dataclasses.asdict(work))
        return real(cal, n, work)

    calibration.estimate_seconds = spy  # type: ignore[assignment]
    ckpt = scan(root)
    if what == "health":
        seconds = health_seconds(ckpt, select(ckpt, ConvertOptions()), None, workers or None)
    else:
        kind, dtype = ("universal", None) if what == "universal" else ("weights", what)
        request = Request(ConvertOptions(dtype=dtype, workers=workers or None))  # 0: the default
        seconds = get(kind).plan(ckpt, request, out_dir).assess().estimated_seconds
    print(json.dumps({"seconds": seconds, "model": model}))


def child_floor(root: str, what: str, threads: int, out_dir: str) -> None:
    """Read the ranges on `threads` threads (whole ranges, largest first, 1 MiB buffers) and write as many
    bytes as the command writes into one file, `threads` pieces at once; print the seconds."""
    import threading
    from concurrent.futures import ThreadPoolExecutor

    from inspector.convert.reader import buffer

    ranges, out_bytes = _ranges(root, what)
    start = time.perf_counter()
    fds = {p: os.open(p, os.O_RDONLY) for p in {r[0] for r in ranges}}
    local = threading.local()
    size = MiB

    def view() -> memoryview:
        v = getattr(local, "view", None)
        if v is None:
            v = local.view = memoryview(buffer(size))  # on a page, as the tool's read buffers
        return v

    def read(item: tuple[str, int, int]) -> None:
        path, off, n = item
        buf = view()
        while n:
            got = os.preadv(fds[path], [buf[: min(n, size)]], off)
            if got <= 0:
                raise OSError(f"short read in {path}")
            off, n = off + got, n - got

    out = os.path.join(out_dir, "floor.bin")
    fd = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)

    def write(piece: tuple[int, int]) -> None:
        off, n = piece
        buf = view()
        while n:
            k = os.pwrite(fd, buf[: min(n, size)], off)
            off, n = off + k, n - k

    step = max(size, -(-out_bytes // max(1, threads * 4)))
    pieces = [(o, min(step, out_bytes - o)) for o in range(0, out_bytes, step)]
    with ThreadPoolExecutor(threads) as ex:
        list(ex.map(read, sorted(ranges, key=lambda r: -r[2])))
        list(ex.map(write, pieces))
    os.close(fd)
    for f in fds.values():
        os.close(f)
    seconds = time.perf_counter() - start
    os.remove(out)
    copies = what == "health" and _checks_copies(root)  # the 16-bit copy check: issue 43's looser target
    print(json.dumps({"seconds": seconds, "bytes": sum(r[2] for r in ranges), "copies": copies}))


def _checks_copies(root: str) -> bool:
    """Whether health checks 16-bit module copies against their masters here (stages 0-2 save them)."""
    from inspector.convert.options import ConvertOptions, select
    from inspector.health.stream import plan_jobs
    from inspector.scan.scanner import scan

    ckpt = scan(root)
    return any(j.module for j in plan_jobs(ckpt, select(ckpt, ConvertOptions()), None))


# --- the sweep ----------------------------------------------------------------------------------------------


def _files(root: str) -> list[Path]:
    return [f for f in Path(root).rglob("*") if f.is_file()]


def _cache(root: str, state: str) -> None:
    """cold: drop the checkpoint's pages (POSIX_FADV_DONTNEED: clean pages of a file nobody maps go at once);
    warm: read every file once."""
    for f in _files(root):
        fd = os.open(f, os.O_RDONLY)
        try:
            if state == "cold":
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            else:
                while os.read(fd, 16 * MiB):
                    pass
        finally:
            os.close(fd)


def _fresh(out: str, root: str, state: str) -> None:
    """An empty output folder again, and a cold checkpoint dropped again (a warm one stays as the last run
    left it): quick, so the next run follows the last one's freed pages within a second."""
    shutil.rmtree(out, ignore_errors=True)
    os.makedirs(out)
    if state == "cold":
        _cache(root, state)


def _command(what: str, root: str, out: str, n: int) -> list[str]:
    py = [sys.executable, "-m", "inspector"]
    if what == "health":
        return [*py, "health", root, "--json", "--workers", str(n)]
    fmt = ["--format", "universal"] if what == "universal" else ["--format", "weights", "--dtype", what]
    return [*py, "convert", root, out, *fmt, "--workers", str(n), "--progress", "json"]


def _seconds(out: str) -> float:
    """A child's printed seconds; NaN when it failed (the row says so, the sweep goes on)."""
    try:
        return float(json.loads(out)["seconds"])
    except (ValueError, KeyError):
        return float("nan")


def _said(out: str, key: str) -> Any:
    """One key of a child's printed JSON (None when it printed none)."""
    try:
        return json.loads(out).get(key)
    except (ValueError, AttributeError):
        return None


def _model(out: str) -> dict[str, Any] | None:
    """The time model's inputs the prediction child saw (calibration, workers, work), for the refit."""
    try:
        model = json.loads(out).get("model")
    except ValueError:
        return None
    return model if isinstance(model, dict) else None


def _phase(what: str, out: str) -> float | None:
    """The pass's own time: health's `seconds`, a convert's JSON report's (the engine's run)."""
    if what == "health":
        try:
            return float(json.loads(out)["seconds"])
        except (ValueError, KeyError):
            return None
    for line in reversed(out.splitlines()):
        if '"report"' in line:
            return float(json.loads(line)["seconds"])
    return None


def run_sweep(args: argparse.Namespace) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    out = os.path.join(args.workdir, "out")
    for state in args.cache:
        for n in args.workers:
            for what in args.commands:
                shutil.rmtree(out, ignore_errors=True)
                os.makedirs(out)
                _cache(args.root, state)
                guess = _measure([sys.executable, __file__, "--predict", args.root, what, str(n), out])
                # unmeasured, just before: the floor and the run find memory alike
                for _ in range(args.warmup):
                    _measure(_command(what, args.root, out, n))
                    _fresh(out, args.root, state)
                floor = _measure([sys.executable, __file__, "--child", args.root, what, str(n), out])
                _fresh(out, args.root, state)
                run = _measure(_command(what, args.root, out, n))
                row = {"n": n, "cache": state, "what": what, "floor": _seconds(floor["out"])}
                row["copies"] = _said(floor["out"], "copies")
                row |= {k: run[k] for k in ("wall", "cpu", "rss", "code")}
                row["phase"] = _phase(what, run["out"])
                row["busy"] = busiest(run["samples"], row["phase"] or 0.0)
                row["predicted"] = _seconds(guess["out"])
                row["model"] = _model(guess["out"])
                row["loadavg"] = os.getloadavg()[0]  # the machine's load as the run ended
                rows.append(row)
                print(_line(row, rows, args.cores), flush=True)
    shutil.rmtree(out, ignore_errors=True)
    return rows


def _verdict(row: dict[str, Any], rows: list[dict[str, Any]], cores: int) -> str:
    """What the row misses of the targets (issue 30's; health's from issue 43) ("ok" when nothing)."""
    misses = []
    what, n, floor = row["what"], row["n"], row["floor"]
    if what == "health":
        # issue 43's targets: warm <= 2.0x the floor, 3.0x with the 16-bit copy check; cold <= 1.2x
        limit = (3.0 if row.get("copies") else 2.0) if row["cache"] == "warm" else 1.2
        if (row["phase"] or row["wall"]) > limit * floor:
            misses.append(f"pass > {limit}x floor")
    else:
        if row["phase"] is not None and row["phase"] > 1.3 * floor:
            misses.append("phase > 1.3x floor")
        if row["wall"] > 1.5 * floor:
            misses.append("process > 1.5x floor")
    if row["rss"] > 128 * MiB:
        misses.append("RSS > 128 MiB")
    busy = row.get("busy")
    if what in CASTING and busy is not None and busy < 0.8 * min(n, cores):
        misses.append(f"CPU busy < {0.8 * min(n, cores):.1f} cores in the phase")
    fewer = [r["wall"] for r in rows if r["what"] == what and r["cache"] == row["cache"] and r["n"] < n]
    if fewer and row["wall"] > 1.1 * min(fewer):
        misses.append("slower than with fewer workers")
    if row["code"] not in (0, 1):
        misses.append(f"exit {row['code']}")
    if row["floor"] != row["floor"]:
        misses.append("the floor failed")
    error = row["predicted"] / row["wall"] - 1
    if not abs(error) <= 0.25:  # NaN: the prediction failed
        misses.append(f"preflight {error:+.0%}")
    return "FAIL: " + "; ".join(misses) if misses else "ok"


def _line(row: dict[str, Any], rows: list[dict[str, Any]], cores: int) -> str:
    phase = f"{row['phase']:.2f}" if row["phase"] is not None else "–"
    busy = f"{row['busy']:.2f}" if row.get("busy") is not None else "–"
    ratio = (row["phase"] if row["phase"] is not None else row["wall"]) / row["floor"]
    return (
        f"| {row['what']} | {row['cache']} | {row['n']} | {row['wall']:.2f} | {phase} | {row['cpu']:.2f} "
        f"| {row['cpu'] / row['wall']:.2f} | {busy} | {row['rss'] / MiB:.0f} MiB | {row['floor']:.2f} | {ratio:.2f}x "
        f"| {row['predicted']:.2f} ({row['predicted'] / row['wall'] - 1:+.0%}) | {_verdict(row, rows, cores)} |"
    )


def _section(
    args: argparse.Namespace, rows: list[dict[str, Any]], started: str, load: str, commit: str
) -> str:
    size = sum(f.stat().st_size for f in _files(args.root))
    head = [
        f"## Worker sweep (`tests/benchmarks/sweep.py`, issue 30), {started}",
        "",
        f"- Machine: {platform.processor() or platform.machine()}, {os.cpu_count()} logical cores, "
        f"{args.cores} usable; load average at start {load}, at the end "
        + ", ".join(f"{v:.2f}" for v in os.getloadavg()),
        f"- Checkpoint: {args.root} ({size / 1e9:.2f} GB on disk); commit {commit} when the sweep started",
        "- Each run a fresh process; wall, CPU (user + sys) and peak RSS from wait4. Phase: the engine's own "
        "time (health's `seconds`, a convert's JSON report). × floor: phase over the N-thread floor (scan and floor "
        "setup excluded from both). CPU busy: CPU-s over the wall; in the phase: over the busiest stretch as long "
        "as the phase (the child's /proc/PID/stat every 10 ms), the figure the CPU target is judged on.",
        "",
        "| command | cache | workers | wall s | phase s | CPU s | CPU busy (cores) | in the phase | peak RSS "
        "| floor s | × floor | preflight s (vs wall) | verdict |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    return "\n".join(head + [_line(r, rows[: i + 1], args.cores) for i, r in enumerate(rows)]) + "\n"


def _commit() -> str:
    """ZI_COMMIT where it is set (a lent machine's copy of the tree, whose .git there named 35b30d2 for a
    later tree on 2026-12-04), else the checkout's commit."""
    if os.environ.get("ZI_COMMIT"):
        return os.environ["ZI_COMMIT"]
    try:
        done = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=REPO
        )
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "inspector"], capture_output=True, text=True, cwd=REPO
        )
    except OSError:
        return os.environ.get("ZI_COMMIT", "unknown")
    head = done.stdout.strip() if done.returncode == 0 else ""
    if not head:
        return os.environ.get("ZI_COMMIT", "unknown")
    return head + (" (inspector/ modified)" if dirty.stdout.strip() else "")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workdir", default="/tmp/zi-sweep")
    ap.add_argument("--root", help="an existing checkpoint root (default: a demo written into --workdir)")
    ap.add_argument("--params", default="500M")
    ap.add_argument("--stage", type=int, default=2)
    ap.add_argument("--workers", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    ap.add_argument("--cache", nargs="+", choices=("warm", "cold"), default=["warm", "cold"])
    ap.add_argument("--commands", nargs="+", choices=COMMANDS, default=list(COMMANDS))
    ap.add_argument("--append", action="store_true", help="add the section to tests/benchmarks/results.md")
    ap.add_argument(
        "--warmup",
        type=int,
        default=1,
        help="unmeasured runs of each command just before its floor and its run (a first write after a "
        "pause paid 1.4-2.5 s of system time for 1 GB of page cache here, the same run repeated within a "
        "second 0.15-0.45 s: this VM hands free pages back to its host after a moment and faults them in "
        "again on first touch; whichever of the floor and the run came first paid it)",
    )
    ap.add_argument(
        "--rows-json", help="also write the rows (with the model's inputs) here, for fit_preflight.py"
    )
    ap.add_argument("--child", nargs=4, help=argparse.SUPPRESS)
    ap.add_argument("--predict", nargs=4, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.predict:
        root, what, n, out = args.predict
        child_predict(root, what, int(n), out)
        return 0
    if args.child:
        root, what, n, out = args.child
        child_floor(root, what, int(n), out)
        return 0
    os.makedirs(args.workdir, exist_ok=True)
    if not args.root:
        args.root = os.path.join(args.workdir, f"demo-{args.params}-s{args.stage}")
        if not os.path.exists(os.path.join(args.root, "latest")):
            demo = ["demo", args.root, "--params", args.params, "--stage", str(args.stage), "--overwrite"]
            subprocess.run([sys.executable, "-m", "inspector", *demo], check=True, env=_env(), cwd=REPO)
    args.cores = len(os.sched_getaffinity(0))
    started = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    load = ", ".join(f"{v:.2f}" for v in os.getloadavg())
    commit = _commit()
    rows = run_sweep(args)
    text = _section(args, rows, started, load, commit)
    if args.rows_json:
        with open(args.rows_json, "w") as fh:
            json.dump({"cores": args.cores, "started": started, "commit": commit, "rows": rows}, fh, indent=1)
    print(text)
    if args.append:
        with open(HERE / "results.md", "a") as fh:
            fh.write("\n" + text)
    return 1 if any(_verdict(r, rows[: i + 1], args.cores) != "ok" for i, r in enumerate(rows)) else 0


if __name__ == "__main__":
    raise SystemExit(main())
