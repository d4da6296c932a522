"""The preflight panel: predicted peak RAM, output size, disk, time, DeepSpeed's peak; red when it won't fit."""

from __future__ import annotations

from rich.console import Group
from rich.table import Table
from rich.text import Text

from inspector.convert.kinds import Job
from inspector.convert.preflight import Assessment
from inspector.tui.fmt import estimate, plural, shown, size
from inspector.tui.widgets.auto_height import AutoHeightStatic


class PreflightPanel(AutoHeightStatic):
    """Updated live from the export options; `-bad` class (red border) when the job does not fit."""

    DEFAULT_CSS = "PreflightPanel { height: auto; }"

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__("Preflight runs when a checkpoint is open.", id=id)
        self.assessment: Assessment | None = None

    def pending(self) -> None:
        self.update(Text("Preflight: predicting…", style="italic dim"))

    def waiting(self, message: str) -> None:
        """No verdict: the options cannot be planned as typed."""
        self.assessment = None
        self.set_class(False, "-bad")
        self.update(Text(message, style="italic dim"))

    def error(self, message: str) -> None:
        self.assessment = None
        self.set_class(True, "-bad")
        self.update(Text(shown(message), style="bold red"))

    def show(self, a: Assessment, job: Job) -> None:
        """Any output kind's verdict: the same rows, plus the kind's own comparisons with DeepSpeed's tools."""
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
        for label, value, note in job.comparisons(a):
            row(label, size(value), "", note)
        if a.upload_to:  # a bucket: what goes up, and what waits on this disk at once
            row("Upload", size(a.output_bytes), "", f"{plural(len(job.files), 'file')}, {plural(job.tensor_count, 'tensor')}")
            row("Staging", size(a.staged_bytes), disk, f"at most, at once; {size(a.free_disk)} free")
        else:
            row(
                "Output",
                size(a.output_bytes),
                disk,
                f"{plural(len(job.files), 'file')}, {plural(job.tensor_count, 'tensor')}; {size(a.free_disk)} free",
            )
        row("Reads", size(a.read_bytes), "", job.read_note(a))
        if job.where != job.out_dir:  # a folder of its own inside OUT
            row("Into", "", "", shown(job.where))
        row("Time", estimate(a.estimated_seconds), "", "estimate")
        row("Limit", "", "", eff.detail)
        if a.fits:
            verdict = Text.assemble(
                ("✔ Fits", "bold green"),
                f": {size(a.memory_margin)} of RAM and {size(a.disk_margin)} of disk to spare.",
            )
        else:
            verdict = Text.assemble(("✖ Does not fit. ", "bold red"), a.problem, "\n→ ", (a.advice, "italic"))
        self.update(Group(verdict, t))  # the verdict first: it stays in view on a short terminal
