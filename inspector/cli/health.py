"""`zero-inspector health PATH`: every tensor's numbers from one streamed read, findings first.

Exit codes: 0 sound (warnings allowed); 1 NaN/Inf in the masters or frozen weights, or a damaged file.
"""

from __future__ import annotations

import argparse
import math
import threading
from collections.abc import Callable
from typing import Any

from inspector.cli.console import console as _console
from inspector.cli.console import literal, print_json, stdout_closed
from inspector.cli.options import add_filter_options, add_workers_option
from inspector.errors import EXIT_DAMAGED, EXIT_OK

_SHOWN = 40  # findings printed (errors first) before "… and N more"


def cmd_health(args: argparse.Namespace) -> int:
    from inspector.health import HealthProgress, HealthReport, check
    from inspector.health.against import against_location
    from inspector.scan.scanner import scan

    split = tuple(getattr(args, "tp_split", ()))
    ckpt = scan(args.path, args.tag, tp_split=split)
    # scanned alike: the same tensor-parallel splits
    against = scan(*against_location(args.path, args.tag, args.against), tp_split=split) if args.against else None
    report: HealthReport | None = None
    err = _console(stderr=True)
    cancel = threading.Event()
    with err.status("Reading tensors…") as status:
        try:
            for item in check(
                ckpt,
                against,
                include=args.include or (),
                exclude=args.exclude or (),
                cancel=cancel,
                workers=args.workers,
            ):
                if isinstance(item, HealthProgress):
                    status.update(
                        f"Reading tensors… {100 * item.fraction:.0f} % "
                        f"({item.jobs_done}/{item.jobs_total} streams)"
                    )
                elif isinstance(item, HealthReport):
                    report = item
        finally:
            cancel.set()  # Ctrl-C: the workers stop at their next chunk
    assert report is not None
    rc = EXIT_DAMAGED if report.errors else EXIT_OK
    try:
        if args.json:
            print_json(report.as_json())
        else:
            _print(_console(), report, all_tensors=args.tensors)
    except BrokenPipeError:
        stdout_closed()
    return rc


def _print(con: Any, report: Any, all_tensors: bool) -> None:
    from inspector.cli.render import findings

    head = f"[bold]Health of {literal(report.tag)}[/] (ZeRO-{report.stage})"
    if report.against:
        head += f" against [bold]{literal(report.against)}[/]"
    from inspector.system.units import format_bytes

    read = format_bytes(report.bytes_read)  # "412.5 MiB", not "0.40 GiB" (nor "0.00 GiB" for a small tag)
    con.print(f"{head}: {len(report.rows)} streams, {read} read in {report.seconds:.1f} s")
    if all_tensors:
        _print_tensors(con, report)
    else:
        _print_modules(con, report)
    con.print()
    con.print(
        findings(
            report.findings,
            ok="No findings: no NaN or Inf, no dead, constant or exploded tensors.",
            shown_max=_SHOWN,
            more=" (--json lists all)",
        )
    )


def _print_modules(con: Any, report: Any) -> None:
    from rich.table import Table

    from inspector.health.report import overview, short

    mods: dict[str, dict[str, Any]] = {}
    for m in overview(report.modules):
        mods.setdefault(m.module, {})[m.source] = m
    with_delta = report.against is not None
    t = Table(title="L2 norms per block (m, v: Adam exp_avg, exp_avg_sq; other: frozen, buffers)")
    for col in (
        "submodule",
        "NaN",
        "Inf",
        "master",
        "m",
        "v",
        "16-bit",
        "other",
    ):
        left = col == "submodule"
        t.add_column(col, justify="left" if left else "right", no_wrap=not left, overflow="fold")
    if with_delta:
        t.add_column("Δ since", justify="right")
    for name, by in mods.items():
        nan = sum(m.nan for m in by.values())
        inf = sum(m.inf for m in by.values())
        other = [m for s, m in by.items() if s in ("frozen", "buffer")]
        cells = [
            literal(name or "(top level)"),
            f"[bold red]{nan:,}[/]" if nan else "0",
            f"[bold red]{inf:,}[/]" if inf else "0",
            *(short(by[s].norm) if s in by else "–" for s in ("master", "exp_avg", "exp_avg_sq", "module")),
            short(math.sqrt(sum(m.norm**2 for m in other))) if other else "–",
        ]
        if with_delta:
            cells.append(short(by["master"].delta_norm) if "master" in by else "–")
        t.add_row(*cells)
    con.print(t)


def _print_tensors(con: Any, report: Any) -> None:
    from rich.table import Table

    from inspector.health.report import short

    with_delta = report.against is not None
    t = Table(title="Per tensor")
    cols = ["tensor", "source", "values", "NaN", "Inf", "zeros", "min", "max", "mean", "std", "norm"]
    for col in cols + (["Δ", "Δ/norm"] if with_delta else []):
        t.add_column(col, justify="left" if col in ("tensor", "source") else "right")
    for r in report.rows:
        st = r.stats
        cells = [
            literal(r.name),
            r.source,
            f"{st.numel:,}",
            f"[bold red]{st.nan:,}[/]" if st.nan else "0",
            f"[bold red]{st.inf:,}[/]" if st.inf else "0",
            f"{st.zeros:,}",
            *(short(v) for v in (st.minimum, st.maximum, st.mean, st.std, st.norm)),
        ]
        if with_delta:
            cells += [short(r.delta_norm), short(r.delta_rel)]
        t.add_row(*cells)
    con.print(t)


def register(sub: Any, add_common: Callable[[argparse.ArgumentParser], None]) -> None:
    from inspector.cli.parser import add_command

    add_command(
        sub,
        "health",
        "every tensor's NaN/Inf, zeros, range, mean, std and norm, streamed; findings first",
        lambda p: _options(p, add_common),
    )


def _options(p: argparse.ArgumentParser, add_common: Callable[[argparse.ArgumentParser], None]) -> None:
    add_common(p)
    p.add_argument(
        "--against",
        metavar="TAG|PATH[@TAG]",
        help="also measure how far each master moved since then: another tag of this checkpoint, another "
        "checkpoint's folder (a sibling Trainer checkpoint-N by its name), or PATH@TAG",
    )
    add_filter_options(p)
    p.add_argument("--json", action="store_true", help="print one JSON object instead of tables")
    add_workers_option(p)
    p.add_argument(
        "--tensors", action="store_true", help="list every tensor instead of grouping by submodule"
    )
    p.set_defaults(func=cmd_health)
