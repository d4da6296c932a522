"""The preflight panel: predicted peak RAM, output size, disk, time, DeepSpeed's peak; red when it won't fit."""

from __future__ import annotations

from rich.console import Group
from rich.table import Table
from rich.text import Text
from textual.widgets import Static

from inspector.convert.plan import ConversionPlan
from inspector.convert.preflight import Assessment
from inspector.tui.fmt import duration, size


class PreflightPanel(Static):
    """Updated live from the export options; `-bad` class (red border) when the job does not fit."""

    DEFAULT_CSS = "PreflightPanel { height: auto; }"

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__("Preflight runs when a checkpoint is open.", id=id)
        self.assessment: Assessment | None = None

    def pending(self) -> None:
        self.update(Text("Preflight: predicting…", style="italic dim"))

    def error(self, message: str) -> None:
        self.assessment = None
        self.set_class(True, "-bad")
        self.update(Text(message, style="bold red"))

    def show(self, a: Assessment, plan: ConversionPlan) -> None:
        self.assessment = a
        self.set_class(not a.fits, "-bad")
        t = Table.grid(padding=(0, 1))
        t.add_column(style="bold", no_wrap=True)
        t.add_column()
        mem = "green" if a.fits_memory else "bold red"
        disk = "green" if a.fits_disk else "bold red"
        eff = a.budget.effective

        def row(label: str, value: str, style: str, detail: str) -> None:
            t.add_row(label, Text.assemble((value, style), "  ", (detail, "dim")))

        row("Peak RAM", size(a.predicted_peak_rss), mem, f"of {size(eff.bytes)} available ({eff.source})")
        row("zero_to_fp32", size(a.deepspeed_peak_rss), "", "DeepSpeed's own tool, same job")
        row(
            "Output",
            size(a.output_bytes),
            disk,
            f"{len(plan.shards)} file(s), {plan.tensor_count} tensors; {size(a.free_disk)} free",
        )
        row("Reads", size(a.read_bytes), "", "from the checkpoint")
        row("Time", f"~{duration(a.estimated_seconds)}", "", "estimate")
        row("Limit", "", "", eff.detail)
        if a.fits:
            verdict = Text.assemble(
                ("✔ Fits", "bold green"),
                f": {size(a.memory_margin)} of RAM and {size(a.disk_margin)} of disk to spare.",
            )
        else:
            verdict = Text.assemble(("✖ Does not fit. ", "bold red"), a.problem, "\n→ ", (a.advice, "italic"))
        self.update(Group(verdict, t))  # the verdict first: it stays in view on a short terminal
