"""Rich renderings of a scanned checkpoint for the terminal (CLI only; the core never imports rich)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rich.console import Console, RenderableType
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from inspector.cli.console import literal as escape
from inspector.convert.preflight import Assessment
from inspector.faces.findings import findings_grid
from inspector.scan.json_view import adapter_json
from inspector.scan.model import Checkpoint, Kind
from inspector.scan.summary import (
    FindingLike,
    alignment_padding,
    kind_totals,
    module_rows,
    rank_row,
    summary_rows,
)
from inspector.system.units import format_bytes, format_count, plural
from inspector.text import shown

_KIND_STYLE = {Kind.TRAINABLE: "green", Kind.FROZEN: "blue", Kind.BUFFER: "magenta", Kind.TIED: "yellow"}


size = format_bytes  # one formatter for sizes and one for counts, shared with the TUI
count = format_count


def summary(ckpt: Checkpoint) -> Panel:
    t = Table.grid(padding=(0, 2))
    t.add_column(style="bold")
    t.add_column()
    for row in summary_rows(ckpt):
        value = f"[bold]{escape(row.value)}[/]" if row.key == "tag" else escape(row.value)
        t.add_row(row.label, value + (f"  [dim]{escape(row.note)}[/]" if row.note else ""))
    kinds = Table.grid(padding=(0, 2))
    for _ in range(4):
        kinds.add_column(justify="right")
    kinds.add_row("[dim]kind[/]", "[dim]tensors[/]", "[dim]parameters[/]", "[dim]source bytes[/]")
    for k in kind_totals(ckpt):
        kinds.add_row(
            Text(str(k.kind), style=_KIND_STYLE[k.kind]), str(k.tensors), count(k.numel), size(k.nbytes)
        )
    t.add_row("Contents", kinds)
    adapter = adapter_json(ckpt)
    if adapter and "error" in adapter:
        t.add_row("LoRA adapter", f"[yellow]{escape(adapter['error'])}[/]")
    elif adapter:
        t.add_row(
            "LoRA adapter",
            f"{adapter['layers']} layers ({escape(', '.join(adapter['target_modules']))}) · r {adapter['r']} · "
            f"alpha {adapter['lora_alpha']}{' · rsLoRA' if adapter['use_rslora'] else ''} · "
            f"{count(adapter['numel'])} params · base {escape(str(adapter['base_model_name_or_path']))}\n"
            f"[dim]convert --format adapter (PEFT layout) or --format merged"
            + (
                f"; merge refused: {escape('; '.join(adapter['merge_problems']))}"
                if adapter["merge_problems"]
                else ""
            )
            + "[/]",
        )
    return Panel(t, title="zero-inspector scan", title_align="left", border_style="blue")


def ranks_table(ckpt: Checkpoint, limit: int = 12) -> Table:
    t = Table(title="Ranks", title_justify="left", show_edge=False)
    t.add_column("rank", justify="right")
    t.add_column("files", overflow="fold")  # whole names, one per line: a cut name cannot be copied
    t.add_column("size", justify="right")
    for g in ckpt.groups:
        t.add_column(f"group {g.index}\nstored / padding", justify="right")
    ranks = ckpt.ranks
    align = alignment_padding(ckpt)
    if align:
        t.caption = "padding: end of the group + alignment between parameters (param_alignment_paddings)"
        t.caption_justify = "left"
    shown = ranks if len(ranks) <= limit else ranks[: limit - 2] + ranks[-2:]
    for i, r in enumerate(shown):
        if len(ranks) > limit and i == limit - 2:
            t.add_row(
                "…", f"[dim]{plural(len(ranks) - limit, 'more rank')}[/]", "", *["" for _ in ckpt.groups]
            )
        row = rank_row(r)
        t.add_row(str(row.rank), "\n".join(escape(f) for f in row.files), size(row.nbytes), *row.group_cells)
    return t


def modules_table(ckpt: Checkpoint) -> Table:
    t = Table(title="Tensors by module", title_justify="left", show_edge=False)
    t.add_column("module")
    t.add_column("tensors", justify="right")
    t.add_column("parameters", justify="right")
    t.add_column("kinds")
    t.add_column("dtype")
    for row in module_rows(ckpt.tensors):
        kinds = " ".join(
            f"[{_KIND_STYLE[Kind(k)]}]{k}[/]" + (f"×{n}" if n > 1 else "") for k, n in row.kinds.items()
        )
        t.add_row(
            escape(row.module), str(row.tensors), count(row.numel), kinds, ", ".join(sorted(row.dtypes))
        )
    return t


def tensors_table(ckpt: Checkpoint) -> Table:
    t = Table(title="Tensors", title_justify="left", show_edge=False)
    for col in ("name", "shape", "dtype", "kind", "size"):
        t.add_column(col, justify="right" if col == "size" else "left")
    for x in ckpt.tensors:
        kind = Text(str(x.kind), style=_KIND_STYLE[x.kind])
        if x.alias_of:
            kind.append(f" → {shown(x.alias_of)}", style="dim")
        name = Text(shown(x.name))
        t.add_row(name, "×".join(map(str, x.shape)) or "scalar", x.dtype, kind, size(x.nbytes))
    return t


def findings(
    items: Sequence[FindingLike], ok: str = "No problems found.", shown_max: int = 40, more: str = ""
) -> RenderableType:
    """Scan's and health's findings, drawn as the app draws them (`faces.findings`); `more` says where the
    ones past `shown_max` are."""
    return findings_grid(items, ok, shown_max, more)


def print_scan(console: Console, ckpt: Checkpoint, all_tensors: bool = False) -> None:
    console.print(summary(ckpt))
    if ckpt.ranks:  # a universal checkpoint has no rank files
        console.print(ranks_table(ckpt))
    console.print()
    console.print(tensors_table(ckpt) if all_tensors else modules_table(ckpt))
    console.print()
    console.print(
        Panel(
            findings(ckpt.findings),
            title="Findings",
            title_align="left",
            border_style="red" if ckpt.errors else "green",
        )
    )


def print_assessment(console: Console, a: Assessment, job: Any, verdict: bool = True) -> None:
    """The preflight figures of any output kind's job, and the verdict unless the caller reports it as an
    error instead."""
    t = Table.grid(padding=(0, 2))
    t.add_column(style="bold")
    t.add_column(justify="right")
    t.add_column()
    mem_style = "green" if a.fits_memory else "bold red"
    disk_style = "green" if a.fits_disk else "bold red"
    t.add_row(
        "Peak RAM (zero-inspector)",
        f"[{mem_style}]{format_bytes(a.predicted_peak_rss)}[/]",
        escape(f"of {format_bytes(a.budget.effective.bytes)} available · {a.budget.effective.source}"),
    )
    for label, value, note in job.comparisons(a):
        t.add_row(escape(label), format_bytes(value), escape(note))
    if a.upload_to:
        t.add_row(
            "Upload",
            format_bytes(a.output_bytes),
            escape(f"{job.kind} · {plural(len(job.files), 'file')} to {a.upload_to}, each as soon as it is written"),
        )
        t.add_row(
            "Staging",
            f"[{disk_style}]{format_bytes(a.staged_bytes)}[/]",
            escape(f"at most, at once · {format_bytes(a.free_disk)} free at {a.out_dir}"),
        )
    else:
        t.add_row(
            "Output",
            f"[{disk_style}]{format_bytes(a.output_bytes)}[/]",
            escape(f"{job.kind} · {plural(len(job.files), 'file')} · {format_bytes(a.free_disk)} free at {a.out_dir}"),
        )
    t.add_row("Reads", format_bytes(a.read_bytes), escape(job.read_note(a)))
    t.add_row("Time", f"~{a.estimated_seconds:.0f} s", "estimate from the measured throughput")
    t.add_row("Memory limit", "", escape(a.budget.effective.detail))
    line = (
        f"[green]Fits[/]: {format_bytes(a.memory_margin)} of RAM and {format_bytes(a.disk_margin)} of "
        "disk to spare."
        if a.fits
        else f"[bold red]Does not fit:[/] {escape(a.problem)}\n→ {escape(a.advice)}"
    )
    console.print(Panel(t, title="Preflight", title_align="left", border_style="green" if a.fits else "red"))
    if verdict:
        console.print(line)
