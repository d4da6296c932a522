#!/usr/bin/env python
"""Refit preflight's time model (`inspector/convert/calibrate.py`) to what runs on this machine took.

Input: the rows `sweep.py --rows-json` writes (each with the model's inputs as the prediction child saw
them: the calibration, the workers, the work) and the run's measured whole-process wall. The fit minimises
the squared log error of the prediction over every row (Nelder-Mead on the logarithm of each constant, from
the current values), then prints the current and the refitted constants and, for each, how many rows fall
within 25 % of the wall. Nothing is written: the constants are copied into calibrate.py by hand, with the
figures, so a refit is reviewed like any other change.

    python tests/benchmarks/fit_preflight.py /tmp/fit/rows-*.json
    python tests/benchmarks/fit_preflight.py --check ROWS.json   # the current constants only
    python tests/benchmarks/fit_preflight.py --fix READ_COST=3.5 ROWS.json   # hold one

Fit on one set of sweeps and `--check` on another (another demo, another hour) before trusting a refit.
The rows behind a committed refit are kept in tests/benchmarks/rows/<date>-<machine>/ (a few KB each), so a
later refit can be checked against every machine seen, not only the one at hand:

    python tests/benchmarks/fit_preflight.py --check tests/benchmarks/rows/*/*.json
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Callable, Sequence
from dataclasses import fields
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import inspector.convert.calibrate as calibration
from inspector.convert.calibrate import Calibration, Work

FITTED = calibration.FITTED  # the constants the fit may move


def load(paths: Sequence[str], rates: str | None = None) -> list[dict[str, Any]]:
    """Every row with a model and a wall, from the sweep files (`rates`: the machine's probes, for rows
    written before the calibration took them)."""
    extra = {"rates": machine_rates(rates)} if rates else {}
    rows = []
    for p in paths:
        with open(p) as fh:
            data = json.load(fh)
        for r in data["rows"]:
            if r.get("model") and r.get("code") == 0 and r["wall"] > 0:
                rows.append(r | {"file": Path(p).name} | extra)
    return rows


def machine_rates(path: str) -> dict[str, float]:
    """The per-kind rates `probes.py` printed on a machine (its JSON, or the device script's machine.txt:
    the first object in it), as the calibration's fields: for rows written before preflight took them."""
    text = Path(path).read_text()
    said = json.JSONDecoder().raw_decode(text[text.index("{") :])[0]
    pre = said.get("preflight", {})
    return {
        "read_rate": said["page cache"]["pread resident"],
        "crc_rate": pre.get("crc_rate", said["crc32 1 MiB"]),
        "py_rate": pre.get("py_rate", said["python loop"]),
        "reduce_rate": pre.get("reduce_rate", said["min+max+squares 4 MiB fp32"]),
    }


def _parse(row: dict[str, Any]) -> tuple[Calibration, int, Work]:
    m = row["model"]
    names = {f.name for f in fields(Calibration)}
    cal = row.get("rates", {}) | {k: v for k, v in m["cal"].items() if k in names}
    work = dict(m["work"])
    if not (work.get("reduced") or work.get("checked")):  # no statistics: the reduction probe prices nothing
        cal.setdefault("reduce_rate", math.inf)
    missing = {"read_rate", "crc_rate", "py_rate", "reduce_rate"} - set(cal)
    if missing:
        raise SystemExit(
            f"{row['file']}: rows without {', '.join(sorted(missing))}: give --rates MACHINE.json"
        )
    if "range_cost" in work:  # rows written before the read's cost was a kind (`Work.gathered_reads`)
        work["gathered_reads"] = work.pop("range_cost") < 1e6
    if "light_reads" in work:  # and before universal's reads were counted as gathered (2026-12-04 15:20)
        work["gathered_reads"] = work.pop("light_reads")
    work["gathered_reads"] = work["gathered_reads"] or row.get("what") == "universal"
    return Calibration(**cal), m["workers"], Work(**work)


def predict(row: dict[str, Any], constants: dict[str, float]) -> float:
    """The model's seconds for `row` with `constants` in place of calibrate.py's."""
    saved = {k: getattr(calibration, k) for k in constants}
    try:
        for k, v in constants.items():
            setattr(calibration, k, v)
        cal, workers, work = _parse(row)
        return calibration.estimate_seconds(cal, workers, work)
    finally:
        for k, v in saved.items():
            setattr(calibration, k, v)


def loss(rows: list[dict[str, Any]], constants: dict[str, float]) -> float:
    return sum(math.log(predict(r, constants) / r["wall"]) ** 2 for r in rows) / len(rows)


def within(rows: list[dict[str, Any]], constants: dict[str, float], bound: float = 0.25) -> int:
    return sum(abs(predict(r, constants) / r["wall"] - 1.0) <= bound for r in rows)


def nelder_mead(f: Callable[[list[float]], float], x0: list[float], steps: int = 3000) -> list[float]:
    """A plain Nelder-Mead (no scipy in the test environment): good enough for a handful of constants."""
    n = len(x0)
    simplex = [x0] + [[x + (0.3 if i == j else 0.0) for j, x in enumerate(x0)] for i in range(n)]
    scores = [f(x) for x in simplex]
    for _ in range(steps):
        order = sorted(range(n + 1), key=scores.__getitem__)
        simplex, scores = [simplex[i] for i in order], [scores[i] for i in order]
        centre = [sum(x[j] for x in simplex[:-1]) / n for j in range(n)]
        worst = simplex[-1]

        def toward(t: float, worst: list[float] = worst, centre: list[float] = centre) -> list[float]:
            return [c + t * (w - c) for c, w in zip(centre, worst, strict=True)]

        refl = toward(-1.0)
        fr = f(refl)
        if fr < scores[0]:
            exp = toward(-2.0)
            fe = f(exp)
            simplex[-1], scores[-1] = (exp, fe) if fe < fr else (refl, fr)
        elif fr < scores[-2]:
            simplex[-1], scores[-1] = refl, fr
        else:
            con = toward(0.5)
            fc = f(con)
            if fc < scores[-1]:
                simplex[-1], scores[-1] = con, fc
            else:
                best = simplex[0]
                simplex = [best] + [
                    [b + 0.5 * (x - b) for b, x in zip(best, s, strict=True)] for s in simplex[1:]
                ]
                scores = [scores[0]] + [f(s) for s in simplex[1:]]
        if max(scores) - min(scores) < 1e-10:
            break
    return simplex[min(range(n + 1), key=scores.__getitem__)]


def fit(rows: list[dict[str, Any]], fixed: dict[str, float]) -> dict[str, float]:
    """The constants that minimise the squared log error of the walls, those in `fixed` held (each fitted
    through its logarithm: all are positive)."""
    current = {k: float(getattr(calibration, k)) for k in FITTED}
    free = [k for k in FITTED if k not in fixed]

    def f(xs: list[float]) -> float:
        return loss(rows, current | fixed | {k: math.exp(x) for k, x in zip(free, xs, strict=True)})

    best = nelder_mead(f, [math.log(current[k]) for k in free])
    return current | fixed | {k: math.exp(x) for k, x in zip(free, best, strict=True)}


def report(rows: list[dict[str, Any]], constants: dict[str, float], title: str) -> None:
    print(
        f"{title}: {within(rows, constants)} of {len(rows)} rows within 25 %, rms log error "
        f"{math.sqrt(loss(rows, constants)):.3f}"
    )
    by: dict[str, list[float]] = {}
    for r in rows:
        by.setdefault(f"{r['what']} {r['cache']}", []).append(predict(r, constants) / r["wall"] - 1.0)
    for k, errs in sorted(by.items()):
        print(f"  {k:16} " + " ".join(f"{e:+.0%}" for e in errs))


def model_cpu(row: dict[str, Any], constants: dict[str, float]) -> float:
    """The model's CPU-seconds for `row` (start-up and every thread's work, at the probes' rates): set
    against the run's measured CPU, it parts a per-byte cost that is wrong from a share of the cores that is."""
    saved = {k: getattr(calibration, k) for k in constants}
    try:
        for k, v in constants.items():
            setattr(calibration, k, v)
        cal, _, work = _parse(row)
        return calibration.alone_seconds(cal, work) + sum(calibration.cpu_seconds(cal, work))
    finally:
        for k, v in saved.items():
            setattr(calibration, k, v)


def table(rows: list[dict[str, Any]], constants: dict[str, float]) -> None:
    """The rows as results.md shows them: the prediction against the wall, the model's CPU against the
    run's, the machine's load average as the run ended and the others runnable the calibration saw."""
    print(
        "| rows | command | cache | workers | load avg | others runnable | predicted s | wall s | error "
        "| model CPU s | CPU s |"
    )
    print("|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        cal = r["model"]["cal"]
        guess = predict(r, constants)
        load = f"{r['loadavg']:.1f}" if "loadavg" in r else "–"
        print(
            f"| {r['file']} | {r['what']} | {r['cache']} | {r['n']} | {load} | {cal['load']:.1f} "
            f"| {guess:.2f} | {r['wall']:.2f} | {guess / r['wall'] - 1:+.0%} "
            f"| {model_cpu(r, constants):.2f} | {r['cpu']:.2f} |"
        )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("rows", nargs="+", help="files written by sweep.py --rows-json")
    ap.add_argument("--check", action="store_true", help="report the current constants only")
    ap.add_argument("--table", action="store_true", help="with --check: the rows as a results.md table")
    ap.add_argument(
        "--fix",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="hold a constant at a value measured elsewhere (READ_COST from the read floor, say)",
    )
    ap.add_argument(
        "--rates",
        metavar="MACHINE",
        help="probes.py's output on the machine the rows come from (rows written "
        "before preflight took the per-kind probes; the device script's machine.txt will do)",
    )
    ap.add_argument(
        "--check-on",
        nargs="+",
        default=[],
        metavar="ROWS",
        help="rows of another machine to report the fitted constants on (with --check-rates)",
    )
    ap.add_argument("--check-rates", metavar="MACHINE", help="probes.py's output on the --check-on machine")
    args = ap.parse_args()
    rows = load(args.rows, args.rates)
    other = load(args.check_on, args.check_rates) if args.check_on else []
    if not rows:
        print("no rows with the model's inputs (run sweep.py --rows-json)", file=sys.stderr)
        return 2
    current = {k: float(getattr(calibration, k)) for k in FITTED}
    report(rows, current, "current")
    if other:
        report(other, current, "current, on the other machine")
    if args.check:
        if args.table:
            table(rows, current)
        return 0
    fixed = {k: float(v) for k, _, v in (f.partition("=") for f in args.fix)}
    unknown = set(fixed) - set(FITTED)
    if unknown:
        print(f"not a fitted constant: {', '.join(sorted(unknown))}", file=sys.stderr)
        return 2
    new = fit(rows, fixed)
    report(rows, new, "refitted")
    if other:
        report(other, new, "refitted, on the other machine")
    for k in FITTED:
        print(f"{k} = {new[k]:.4g}  # was {current[k]:.4g}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
