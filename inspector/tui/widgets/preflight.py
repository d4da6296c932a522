"""The preflight panel: predicted peak RAM, output size, disk, time, DeepSpeed's peak; red when it won't fit."""

from __future__ import annotations

from rich.console import Group
from rich.table import Table
from rich.text import Text

from inspector.convert.plan import ConversionPlan
from inspector.convert.preflight import Assessment
from inspector.tui.fmt import duration, shown, size
from inspector.tui.universal import UniversalAssessment, UniversalPlanView
from inspector.tui.widgets.auto_height import AutoHeightStatic


class PreflightPanel(AutoHeightStatic):
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
        self.update(Text(shown(message), style="bold red"))

    def show(self, a: Assessment | UniversalAssessment, plan: ConversionPlan | UniversalPlanView) -> None:
        if isinstance(a, UniversalAssessment) or isinstance(plan, UniversalPlanView):
            assert isinstance(a, UniversalAssessment) and isinstance(plan, UniversalPlanView)
            self.show_universal(a, plan)
            return
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

    def show_universal(self, a: UniversalAssessment, plan: UniversalPlanView) -> None:
        """`preflight --format universal`'s numbers: peak RAM, output against free disk, reads, time."""
        self.assessment = None
        e = a.est
        self.set_class(not a.fits, "-bad")
        t = Table.grid(padding=(0, 1))
        t.add_column(style="bold", no_wrap=True)
        t.add_column()

        def row(label: str, value: str, style: str, detail: str) -> None:
            t.add_row(label, Text.assemble((value, style), "  ", (detail, "dim")))

        row(
            "Peak RAM",
            size(e.predicted_peak_rss),
            "green" if a.fits_memory else "bold red",
            f"of {size(e.available_memory)} available ({e.memory_source})",
        )
        row(
            "Output",
            size(e.output_bytes),
            "green" if a.fits_disk else "bold red",
            f"{plan.file_count} file(s), {plan.tensor_count} parameters; {size(e.free_disk)} free",
        )
        row("ds_to_univ.", size(e.deepspeed_peak_disk), "", "DeepSpeed's tool peaks near this on disk")
        row("Reads", size(e.read_bytes), "", "from the checkpoint")
        row("Time", f"~{duration(e.estimated_seconds)}", "", "estimate")
        row("Writes", "", "", plan.out_dir)
        if a.fits:
            verdict = Text.assemble(
                ("✔ Fits", "bold green"),
                f": {size(e.available_memory - e.predicted_peak_rss)} of RAM and "
                f"{size(e.free_disk - e.output_bytes)} of disk to spare.",
            )
        else:
            verdict = Text.assemble(("✖ Does not fit. ", "bold red"), a.problem, "\n→ ", (a.advice, "italic"))
        self.update(Group(verdict, t))
