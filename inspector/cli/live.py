"""What a `convert` run shows while and after it runs: a live bar in a terminal, a plain line every few
seconds in a CI log (no TTY), the Ray tasks' shares, and the report of what was written. Apart from the command,
which decides what runs."""

from __future__ import annotations

import time
from typing import Any

from inspector.cli.console import literal as escape
from inspector.system.units import format_bytes, plural

_LOG_INTERVAL = 5.0


def _progress_line(ev: Any, mem: str, unit: str = "file") -> str:
    eta = (ev.bytes_total - ev.bytes_done) / ev.throughput if ev.throughput > 0 else 0.0
    return (
        f"[{ev.fraction * 100:5.1f}%] {format_bytes(ev.bytes_done)} / {format_bytes(ev.bytes_total)}  "
        f"{format_bytes(ev.throughput)}/s  ETA {eta:.0f}s  {_where(ev, unit)}  {mem}"
    )


def _where(ev: Any, unit: str) -> str:
    """`files 3/8` finished for a run here, of the files the header counted (the one count; files written side
    by side never make it go back); a Ray run's events say themselves how many parts are done."""
    if unit != "file":
        return ev.shard
    return (
        f"files {ev.files_done}/{ev.files_total}"
        if ev.files_total
        else f"file {ev.shard_index + 1}/{ev.shards}"
    )


def _memory_line() -> str:
    from inspector.system.limits import available_memory  # /proc/meminfo: psutil's import costs start-up
    from inspector.system.rss import current_rss, peak_rss

    now = current_rss()
    return (
        f"RSS {format_bytes(now)} (peak {format_bytes(max(now, peak_rss()))}), "
        f"available {format_bytes(available_memory())}"
    )


def print_tasks(console: Any, tasks: list[Any]) -> None:
    nodes = sorted({t.node for t in tasks})
    console.print(
        f"Ray: {plural(len(tasks), 'part')} on {plural(len(nodes), 'node')}; "
        + ", ".join(
            f"part {t.part}: {format_bytes(t.bytes_written)} in {t.seconds:.1f} s"
            for t in sorted(tasks, key=lambda t: t.part)
        )
        + "; then finished here."
    )


def drive(console: Any, events: Any, total: int, unit: str = "file") -> Any:
    """Consume run() events with a live bar (terminal) or periodic log lines (CI)."""
    from inspector.convert.executor import Progress, Report

    if not console.is_terminal:
        last, unsaid = 0.0, None
        for ev in events:
            if isinstance(ev, Report):
                if unsaid is not None:  # the log's last progress line is where the run ended (100 %)
                    console.print(_progress_line(unsaid, _memory_line(), unit), soft_wrap=True)
                return ev
            if isinstance(ev, Progress):
                unsaid = ev
                if time.monotonic() - last >= _LOG_INTERVAL:
                    last, unsaid = time.monotonic(), None
                    console.print(_progress_line(ev, _memory_line(), unit), soft_wrap=True)
        return None
    from rich.progress import BarColumn, DownloadColumn, TextColumn, TimeRemainingColumn
    from rich.progress import Progress as Bar

    with Bar(
        TextColumn("{task.description}"),
        BarColumn(),
        DownloadColumn(binary_units=True),
        TextColumn("{task.fields[speed]}"),  # MiB/s beside MiB (Rich's speed column says MB/s)
        TimeRemainingColumn(),
        TextColumn("{task.fields[mem]}"),
        console=console,
        transient=False,
    ) as bar:
        task = bar.add_task("converting", total=total, mem="", speed="")
        for ev in events:
            if isinstance(ev, Report):
                bar.refresh()
                return ev
            if isinstance(ev, Progress):
                bar.update(
                    task,
                    completed=ev.bytes_done,
                    total=ev.bytes_total,
                    description=_where(ev, unit),
                    mem=_memory_line(),
                    speed=f"{format_bytes(ev.throughput)}/s",
                )
    return None


def duration(seconds: float) -> str:
    """A duration as said to people: "2.6 s", and "40 ms" below a second (never "0.0 s")."""
    return f"{seconds:.1f} s" if seconds >= 1 else f"{max(seconds * 1000, 1):.0f} ms"


def print_report(
    console: Any, report: Any, job: Any, part: tuple[int, int] | None = None, total: float | None = None
) -> None:
    """The files written and the one summary line. `total`: the whole command's seconds (scan and plan
    included), which is what "Done in" says; the rate is over the writing alone."""
    from rich.table import Table

    from inspector.system.rss import peak_rss

    t = Table(title="Written", title_justify="left", show_edge=False)
    t.add_column("file")
    t.add_column("size", justify="right")
    for name, size in report.files:
        t.add_row(escape(name), format_bytes(size))
    console.print(t)
    rate = report.bytes_written / report.seconds if report.seconds else 0.0
    resumed = (  # a finishing run after --part runs reuses their files, as a rerun reuses a killed run's
        f", {plural(report.resumed_shards, 'file')} reused (written by --part runs or an interrupted run)"
        if report.resumed_shards
        else ""
    )
    console.print(
        f"[green]Done[/] in {duration(report.seconds if total is None else total)}: {report.tensors} tensors, "
        f"{format_bytes(report.bytes_written)} written at {format_bytes(int(rate))}/s, "
        f"peak RSS {format_bytes(peak_rss())}{resumed}."
    )
    aliases = getattr(getattr(job, "plan", None), "aliases", None)
    if isinstance(aliases, dict) and aliases:
        console.print(
            escape(f"Tied weights stored once: {', '.join(f'{a} → {o}' for a, o in aliases.items())}.")
        )
    if report.removed_stale:
        console.print(
            escape(f"Removed stale files from an earlier conversion: {', '.join(report.removed_stale)}.")
        )
    if part is not None:
        console.print(
            f"Part {part[0]} of {part[1]} (numbered from 0) is written. Once all {part[1]} parts have ended, run "
            "the same command without --part: it reuses every finished file and writes the rest."
        )
    elif words := job.finished_words(report):
        console.print(escape(words, newlines=True))
