#!/usr/bin/env python
"""Rank-count sweep (issue 43): scan and convert of one model saved by 8 to 8,192 ZeRO-3 ranks (two files a
rank), each command a fresh process measured by wait4: wall, CPU (user + system) and its own peak RSS.

    python tests/benchmarks/ranks.py --workdir /tmp/zi-ranks                   # 8 128 1024 4096, 20M
    python tests/benchmarks/ranks.py --ranks 8 1024 --params 2M --append       # rows into results.md
    python tests/benchmarks/ranks.py --ranks 8 1024 --layers 126                # 405B's records per file
    python tests/benchmarks/ranks.py --ranks 8 1024 --layers 126 --also health universal

The targets: scan at 1,024 ranks <= 2.5 x the 8-rank scan (linear in files, a small constant per file);
convert's peak RSS <= 128 MiB at every rank count (memory flat in ranks). Each row says how it compares
(`scan x8` is the CPU time, user + system, over the 8-rank row's: on a shared machine the wall time is mostly
waiting for a core) and what preflight predicted for the convert against its wall (`--rows-json` keeps the
model's inputs for `fit_preflight.py`). Children run with compiled bytecode, as installed (`children.py`).
Timings are not tests: the machine's cores and load go with the rows. The parent imports nothing heavy (a child's peak RSS starts at its parent's).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from children import REPO, child_env  # the script's folder is on the path

SWEEP = Path(__file__).resolve().parent / "sweep.py"
RESULTS = Path(__file__).resolve().parent / "results.md"
MiB = 1 << 20


def run(argv: list[str]) -> tuple[float, float, float, int]:
    """`python -m inspector ARGV` in a fresh interpreter: (wall s, CPU s, peak RSS MiB, exit status)."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, "-m", "inspector", *argv],
        env=child_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    if proc.stderr is not None:
        proc.stderr.close()
    return wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024, os.waitstatus_to_exitcode(status)


def predicted(ckpt: Path, out: Path, what: str = "bf16") -> tuple[float, dict[str, Any] | None]:
    """Preflight's seconds for `what` (`convert --dtype bf16`, `health`, `universal`) of `ckpt` with its
    default workers, and the model's inputs (for `fit_preflight.py`): the worker sweep's prediction child, a
    fresh process as `preflight` is."""
    argv = [sys.executable, str(SWEEP), "--predict", str(ckpt), what, "0", str(out)]
    done = subprocess.run(argv, env=child_env(), cwd=REPO, capture_output=True, text=True, check=False)
    try:
        said = json.loads(done.stdout.strip().splitlines()[-1])
        return float(said["seconds"]), said.get("model")
    except (ValueError, KeyError, IndexError):
        return float("nan"), None


def measured(ckpt: Path, out: Path) -> dict[str, Any]:
    """`scan` (once to warm the page cache, then measured), preflight's prediction and `convert --dtype bf16`
    of `ckpt` into `out`, each a fresh process: a row's measured columns (the DCP file-count sweep's too)."""
    run(["scan", str(ckpt)])
    scan = run(["scan", str(ckpt)])
    guess, model = predicted(ckpt, out)
    conv = run(["convert", str(ckpt), str(out), "--dtype", "bf16"])
    names = ("s", "cpu", "mib", "rc")
    return {**{f"scan_{k}": v for k, v in zip(names, scan, strict=True)},
            **{f"conv_{k}": v for k, v in zip(names, conv, strict=True)},
            "predicted": guess, "model": model}  # fmt: skip


ALSO = {  # what else a row can measure (`--also`): each command's argv
    "health": lambda ckpt, out: ["health", str(ckpt), "--json"],
    "universal": lambda ckpt, out: ["convert", str(ckpt), str(out), "--format", "universal"],
}


def measured_also(ckpt: Path, out: Path, also: list[str]) -> dict[str, Any]:
    """`health` and the universal export of `ckpt` (`--also`), each a fresh process after preflight's
    prediction: their rows' columns."""
    row: dict[str, Any] = {}
    for what in also:
        shutil.rmtree(out, ignore_errors=True)
        row[f"{what}_predicted"], row[f"{what}_model"] = predicted(ckpt, out, what)
        for k, v in zip(("s", "cpu", "mib", "rc"), run(ALSO[what](ckpt, out)), strict=True):
            row[f"{what}_{k}"] = v
        shutil.rmtree(out, ignore_errors=True)
    return row


def also_table(rows: list[dict[str, Any]], also: list[str]) -> str:
    """The `--also` commands' rows: wall, CPU, peak RSS and preflight's seconds against the wall."""
    head = "| ranks (files) | " + " | ".join(
        f"{w} wall | {w} CPU | {w} peak RSS | preflight (vs wall)" for w in also
    )
    lines = [head + " |", "|---" * (1 + 4 * len(also)) + "|"]
    for r in rows:
        cells = []
        for w in also:
            guess, wall = float(r[f"{w}_predicted"]), float(r[f"{w}_s"])
            said = f"{guess:.2f} s ({guess / wall - 1:+.0%})" if guess == guess and wall else "-"
            bad = f" (exit {r[f'{w}_rc']})" if r[f"{w}_rc"] else ""
            cells.append(f"{wall:.2f} s{bad} | {r[f'{w}_cpu']:.2f} s | {r[f'{w}_mib']:.0f} MiB | {said}")
        lines.append(f"| {int(r['ranks']):,} ({int(r['files']):,}) | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def verdict(r: dict[str, Any], base: dict[str, Any]) -> tuple[float, str]:
    """(scan CPU over the first row's, `ok` or what failed): CPU, since on a shared machine wall is mostly
    waiting; the targets: scan <= 2.5x at 1,024 ranks (or files) over 8, convert <= 128 MiB."""
    ratio = float(r["scan_cpu"]) / float(base["scan_cpu"])
    bad = []
    if r["scan_rc"] or r["conv_rc"]:
        bad.append(f"exit {r['scan_rc']}/{r['conv_rc']}")
    if int(r["ranks"]) == 1024 and int(base["ranks"]) == 8 and ratio > 2.5:
        bad.append("scan > 2.5x")
    if float(r["conv_mib"]) > 128:
        bad.append("RSS > 128 MiB")
    return ratio, "FAIL: " + ", ".join(bad) if bad else "ok"


def sweep(
    workdir: Path, ranks: list[int], params: str, layers: int | None = None, also: list[str] | None = None
) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for ws in ranks:
        ckpt, out = workdir / f"ws{ws}", workdir / f"out{ws}"
        shutil.rmtree(ckpt, ignore_errors=True)
        shutil.rmtree(out, ignore_errors=True)
        deep = ["--layers", str(layers)] if layers else []
        demo = run(["demo", str(ckpt), "--stage", "3", "--world-size", str(ws), "--params", params, *deep])
        if demo[3]:
            raise SystemExit(f"demo at {ws} ranks failed (exit {demo[3]})")
        files = sum(1 for _ in next(p for p in ckpt.iterdir() if p.is_dir()).iterdir())
        row = {"ranks": ws, "files": files, "demo_s": demo[0], **measured(ckpt, out)}
        row |= measured_also(ckpt, out, also or [])
        rows.append(row)
        print(table([row], rows[0]).splitlines()[-1], flush=True)
        shutil.rmtree(out, ignore_errors=True)
        shutil.rmtree(ckpt, ignore_errors=True)
    return rows


def table(rows: list[dict[str, Any]], base: dict[str, Any]) -> str:
    lines = [
        "| ranks (files) | scan wall | scan CPU | scan x8 | scan RSS | convert bf16 wall | convert CPU | "
        "convert peak RSS | preflight (vs wall) | verdict |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        ratio, said = verdict(r, base)
        lines.append(
            f"| {int(r['ranks']):,} ({int(r['files']):,}) | {r['scan_s']:.2f} s | {r['scan_cpu']:.2f} s | "
            f"{ratio:.1f}x | {r['scan_mib']:.0f} MiB | {r['conv_s']:.2f} s | {r['conv_cpu']:.2f} s | "
            f"{r['conv_mib']:.0f} MiB | {_against(r)} | {said} |"
        )
    return "\n".join(lines)


def _against(r: dict[str, Any]) -> str:
    """Preflight's seconds and how far the convert's wall was from them."""
    guess = float(r.get("predicted", float("nan")))
    if guess != guess or not r["conv_s"]:
        return "-"
    return f"{guess:.2f} s ({guess / float(r['conv_s']) - 1:+.0%})"


def fit_rows(rows: list[dict[str, Any]], also: list[str]) -> list[dict[str, Any]]:
    """The runs as `fit_preflight.py` reads the worker sweep's rows (the model's inputs, the wall): the
    converts, and the `--also` commands'."""
    out = [
        {"what": "bf16", "cache": "warm", "n": r["ranks"], "wall": r["conv_s"], "cpu": r["conv_cpu"],
         "code": r["conv_rc"], "model": r.get("model"), "predicted": r.get("predicted")}
        for r in rows
    ]  # fmt: skip
    for w in also:
        out += [
            {"what": w, "cache": "warm", "n": r["ranks"], "wall": r[f"{w}_s"], "cpu": r[f"{w}_cpu"],
             "code": r[f"{w}_rc"], "model": r.get(f"{w}_model"), "predicted": r[f"{w}_predicted"]}
            for r in rows
        ]  # fmt: skip
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    ap.add_argument("--workdir", type=Path, default=Path("/tmp/zi-ranks"))
    ap.add_argument("--ranks", type=int, nargs="+", default=[8, 128, 1024, 4096])
    ap.add_argument("--params", default="20M")
    ap.add_argument(
        "--layers",
        type=int,
        help="decoder layers (default: the demo's, 4 at 20M); 126 makes each rank file hold "
        "~1,270 records, as a 405B model's stage-3 files hold ~1,140",
    )
    ap.add_argument("--append", action="store_true", help="append the rows to tests/benchmarks/results.md")
    ap.add_argument("--rows-json", type=Path, help="also write the convert rows here, for fit_preflight.py")
    ap.add_argument("--also", nargs="+", choices=sorted(ALSO), default=[], help="measure these too, each row")
    args = ap.parse_args()
    args.workdir.mkdir(parents=True, exist_ok=True)
    load = os.getloadavg()
    rows = sweep(args.workdir, args.ranks, args.params, args.layers, args.also)
    if args.rows_json:
        args.rows_json.write_text(json.dumps({"rows": fit_rows(rows, args.also or [])}, indent=1))
    what = f"ZeRO-3 demo, {args.params} parameters{f' in {args.layers} layers' if args.layers else ''}, bf16"
    tables = table(rows, rows[0]) + (f"\n\n{also_table(rows, args.also)}" if args.also else "")
    publish("Rank-count sweep (`tests/benchmarks/ranks.py`, issue 43)", what, tables, load, args.append)


def publish(heading: str, what: str, rows: str, load: tuple[float, ...], append: bool) -> None:
    """A sweep's section: its heading and time, what was measured, the machine and its load at the start
    (`load`) and now, the rows; printed, and appended to results.md with `append`."""
    when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    text = (
        f"\n## {heading}, {when}\n\n"
        f"{what}; {os.cpu_count()} cores ({platform.machine()}), load "
        f"average {load[0]:.1f} at the start, {os.getloadavg()[0]:.1f} at the end; page cache warm.\n\n"
        f"{rows}\n"
    )
    print(text)
    if append:
        with RESULTS.open("a") as fh:
            fh.write(text)


if __name__ == "__main__":
    main()
