"""The Health tab: every tensor's numbers from one streamed read, in the background, filling in as it goes.

`h` (anywhere on the main screen) opens the tab and starts the pass for the shown tag; the keys keep working
while it reads (a worker thread; numpy releases the GIL), escape cancels it. When it is done the table sorts
(`s`, or a click on a header) and enter opens the tensor in the Tensors tab. The pass itself is
`inspector.health.check`, the same code as `zero-inspector health`.
"""

from __future__ import annotations

import re
import threading
import time

from rich.text import Text
from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.widgets import DataTable, Input, ProgressBar, Select, Static

from inspector.errors import CancelledError, InspectorError
from inspector.health import HealthProgress, HealthReport, Row
from inspector.health.findings import sibling_ratios
from inspector.scan.model import Checkpoint, Severity
from inspector.tui.against import NO_COMPARISON, against_choices, default_against
from inspector.tui.fmt import plural, shown, size
from inspector.tui.screens.health_pass import FLUSH, HealthUpdate, lower_priority, planned
from inspector.tui.session import name_filter
from inspector.tui.typed import zi
from inspector.tui.widgets.auto_height import AutoHeightStatic
from inspector.tui.widgets.findings import findings_renderable
from inspector.tui.widgets.health_view import (
    SORTS,
    HealthTable,
    row_detail,
)
from inspector.tui.widgets.layer_chart import LayerChart


class HealthPane(Vertical):
    BINDINGS = [
        Binding("escape", "cancel", "Cancel", show=False),
        Binding("a", "against", "Compare with"),
        Binding("slash", "find", "Find", key_display="/"),
    ]

    def __init__(self) -> None:
        super().__init__()
        self.ckpt: Checkpoint | None = None
        self.report: HealthReport | None = None
        self.running = False
        self._run = 0
        self._cancel = threading.Event()
        self._ran_for: tuple[str, str, str] | None = None  # (root, tag, against) of the rows shown
        self._order: dict[str, int] = {}
        self._streams_done = 0
        self._streams = 0  # the pass's streams (a tensor's master, its moments…), known before it reads

    def compose(self) -> ComposeResult:
        with Horizontal(id="health-bar"):
            yield Static("compare with", id="health-against-label")
            yield Select[str](
                [("nothing (this tag alone)", NO_COMPARISON)],
                value=NO_COMPARISON,
                id="health-against",
                allow_blank=False,
                compact=True,
            )
            yield ProgressBar(total=1.0, show_eta=False, id="health-progress", classes="-hidden")
        yield Static(self._intro(), id="health-status")
        yield Input(
            placeholder="find a tensor: glob, regex or text (enter keeps the row)",
            id="health-find",
            classes="-hidden",
            compact=True,
        )
        yield HealthTable(id="health-table")
        yield Static("", id="health-row")
        with VerticalScroll(id="health-side"):
            with Vertical(id="health-findings-box"):
                yield Static("Findings", classes="section")
                yield AutoHeightStatic("", id="health-findings")
            with Vertical(id="health-chart-box"):
                yield Static("Layers", classes="section")
                yield LayerChart(id="health-chart")

    @property
    def table(self) -> HealthTable:
        return self.query_one(HealthTable)

    # --- driven by the main screen ------------------------------------------------------------------------

    def show(self, ckpt: Checkpoint) -> None:
        """A new checkpoint or tag: what was shown belongs to another one (a pass still reading stops)."""
        self._abandon()
        self.ckpt = ckpt
        self._order = {t.name: i for i, t in enumerate(ckpt.tensors)}
        roots = tuple(zi(self).roots)
        choices = against_choices(ckpt, roots)
        default = default_against(ckpt, roots)
        select = self.query_one("#health-against", Select)
        with self.prevent(Select.Changed):
            select.set_options(choices)
            select.value = default
        if self._ran_for and self._ran_for[:2] != (ckpt.root, ckpt.tag):
            self._clear()
        self._status(self._intro())

    def clear(self) -> None:
        """Nothing of the previous checkpoint: its pass stopped, its rows, findings and comparison gone."""
        self._abandon()
        self.ckpt = None
        self._order = {}
        self._clear()
        select = self.query_one("#health-against", Select)
        with self.prevent(Select.Changed):
            select.set_options([("nothing (this tag alone)", NO_COMPARISON)])
            select.value = NO_COMPARISON
        self._status(self._intro())

    def start(self) -> None:
        """Run the pass for the shown tag and comparison, unless its result is already on screen."""
        if self.ckpt is None:
            self.notify("Wait for the scan to finish (or open a checkpoint).", severity="warning")
            return
        key = (self.ckpt.root, self.ckpt.tag, self._against())
        if self.running or (self._ran_for == key and self.report is not None):
            return
        self._clear()
        self._ran_for = key
        self._run += 1
        self._cancel = threading.Event()
        self.running = True
        progress = self.query_one("#health-progress", ProgressBar)
        progress.remove_class("-hidden")
        progress.update(total=1.0, progress=0.0)
        self._status(Text("starting… (escape cancels)", style="italic"))
        self._worker(self.ckpt, key[2] or None, self._cancel, self._run, tuple(zi(self).tp_split))

    def _abandon(self) -> None:
        """Stop a pass still reading and ignore its last messages: a new tag or comparison replaces it."""
        if self.running:
            self._cancel.set()
            self._run += 1
            self._ended(Text(""))

    def on_unmount(self) -> None:
        self._cancel.set()  # the app is closing: the worker threads stop at their next chunk

    # --- the worker ---------------------------------------------------------------------------------------

    @work(thread=True, exclusive=True, group="health", exit_on_error=False, description="health check")
    def _worker(
        self,
        ckpt: Checkpoint,
        against_spec: str | None,
        cancel: threading.Event,
        run: int,
        tp_split: tuple[tuple[str, str], ...] = (),
    ) -> None:
        from inspector.health import check
        from inspector.health.against import against_location
        from inspector.scan.scanner import scan

        lower_priority()  # the pass's reader threads are created from this one and inherit it
        post = self.post_message
        pending: list[Row] = []
        last = time.monotonic()
        try:
            # scanned alike: the same tensor-parallel splits
            located = against_location(ckpt.root, ckpt.tag, against_spec) if against_spec else None
            against = scan(*located, tp_split=tp_split) if located else None
            post(HealthUpdate(run, progress=planned(ckpt, against)))  # the totals up front, not as found
            for item in check(ckpt, against, cancel=cancel):
                if isinstance(item, list):
                    pending.extend(item)
                    if time.monotonic() - last < FLUSH:
                        continue
                elif isinstance(item, HealthReport):
                    post(HealthUpdate(run, rows=pending, report=item))
                    return
                post(
                    HealthUpdate(
                        run, rows=pending, progress=item if isinstance(item, HealthProgress) else None
                    )
                )
                pending, last = [], time.monotonic()
        except CancelledError:
            post(HealthUpdate(run, cancelled=True))
        except InspectorError as exc:
            post(HealthUpdate(run, error=exc))
        except (OSError, ValueError) as exc:
            post(HealthUpdate(run, error=InspectorError(str(exc), title="Cannot read the checkpoint")))

    @on(HealthUpdate)
    def _update(self, msg: HealthUpdate) -> None:
        if msg.run != self._run:
            return  # an older run's last words
        if msg.rows:
            self.table.append(msg.rows, self._order)
            if self.table.cursor_row < 0 or len(self.table.entries) == len(msg.rows):
                self._highlight()
        if msg.progress is not None:
            p = msg.progress
            self._streams, self._streams_done = p.jobs_total, p.jobs_done
            self.query_one("#health-progress", ProgressBar).update(progress=p.fraction)
            broken = sum(1 for e in self.table.entries if e.bad)
            bad = f" · [bold red]{plural(broken, 'row')} with NaN/Inf so far[/]" if broken else ""
            self._status(
                f"reading {size(p.bytes_done)} of {size(p.bytes_total)} · {p.jobs_done:,} of "
                f"{plural(p.jobs_total, 'stream')}{bad} · escape cancels"
            )
        if msg.report is not None:
            self._finished(msg.report)
        elif msg.cancelled:
            self._ended(
                Text(
                    f"Cancelled: {self._streams_done:,} of {plural(self._streams, 'stream')} read. h runs it again.",
                    style="yellow",
                )
            )
        elif msg.error is not None:
            self._ended(Text(f"Stopped: {shown(msg.error.title)}", style="bold red"))
            zi(self).error(msg.error)

    def _finished(self, report: HealthReport) -> None:
        self.report = report
        self.table.complete(sibling_ratios(report.rows))
        self.query_one("#health-findings", AutoHeightStatic).update(
            findings_renderable(
                report.findings,
                ok="No findings: no NaN or Inf, no dead, constant or exploded tensors.",
                more=" (`zero-inspector health --json` lists all)",
            )
        )
        self.query_one(LayerChart).show(report)
        errors, warnings = (
            len(report.errors),
            sum(1 for f in report.findings if f.severity is Severity.WARNING),
        )
        verdict = (
            Text(f"✘ {plural(errors, 'error')}", style="bold red")
            if errors
            else Text("✔ sound", style="bold green")
            if not warnings
            else Text(f"⚠ {plural(warnings, 'warning')}", style="yellow")
        )
        took = f" in {report.seconds:.1f} s" if zi(self).live_meters else ""
        against = f", against {shown(report.against)}" if report.against else ""
        line = Text.assemble(
            verdict,
            f" · {plural(self._streams, 'stream')} read ({plural(len(report.rows), 'row')}) · "
            f"{size(report.bytes_read)}{took}{against}",
        )
        self._ended(line)
        self._highlight()

    def _ended(self, line: Text) -> None:
        self.running = False
        self.query_one("#health-progress", ProgressBar).add_class("-hidden")
        self._status(line)

    # --- what the keys do ---------------------------------------------------------------------------------

    def action_cancel(self) -> None:
        box = self.query_one("#health-find", Input)
        if not box.has_class("-hidden"):  # escape closes the find box first
            box.add_class("-hidden")
            self.table.focus()
        elif self.running:
            self._cancel.set()
            self._status(Text("cancelling…", style="italic"))

    def on_mount(self) -> None:
        select = self.query_one("#health-against", Select)
        self.watch(select, "expanded", self._menu_closed, init=False)

    def _menu_closed(self, expanded: bool) -> None:
        """The comparison menu closed (chosen or escaped): the table has the keys again."""
        if not expanded:  # after the Select takes the focus back itself
            self.call_after_refresh(self._table_if_menu_focused)

    def _table_if_menu_focused(self) -> None:
        if self.query_one("#health-against", Select).has_focus_within:
            self.table.focus()

    def action_find(self) -> None:
        """`/`: a box whose text moves the cursor to the first matching row, as less and k9s do."""
        box = self.query_one("#health-find", Input)
        box.remove_class("-hidden")
        box.focus()

    @on(Input.Changed, "#health-find")
    def _find(self, event: Input.Changed) -> None:
        try:
            pattern = name_filter(event.value)
        except re.error:
            event.input.set_class(True, "-bad-pattern")
            return
        found = pattern is None or self.table.find(pattern)
        event.input.set_class(not found, "-bad-pattern")

    @on(Input.Submitted, "#health-find")
    def _found(self, event: Input.Submitted) -> None:
        event.input.add_class("-hidden")
        self.table.focus()

    def action_against(self) -> None:
        select = self.query_one("#health-against", Select)
        select.focus()
        select.expanded = True

    @on(Select.Changed, "#health-against")
    def _against_changed(self, event: Select.Changed) -> None:
        if self.ckpt is None or (self._ran_for is None and not self.running):
            return  # nothing asked for yet: the choice waits for `h`
        self._abandon()
        self.start()

    @on(HealthTable.Sorted)
    def _sorted(self, event: HealthTable.Sorted) -> None:
        if self.report is not None:
            self.notify(f"Sorted by {SORTS[event.how][0]}.", timeout=2, markup=False)

    @on(DataTable.RowHighlighted, "#health-table")
    def _row(self, event: DataTable.RowHighlighted) -> None:
        self._highlight()

    # --- drawing ------------------------------------------------------------------------------------------

    def _highlight(self) -> None:
        e = self.table.entry_at_cursor()
        self.query_one("#health-row", Static).update(row_detail(e) if e else "")

    def _against(self) -> str:
        value = self.query_one("#health-against", Select).value
        return value if isinstance(value, str) else NO_COMPARISON

    def _clear(self) -> None:
        self.report = None
        self._ran_for = None
        self.table.reset()
        self.query_one("#health-row", Static).update("")
        self.query_one("#health-findings", AutoHeightStatic).update("")
        self.query_one(LayerChart).show(None)

    def _status(self, line: Text | str) -> None:
        self.query_one("#health-status", Static).update(line)

    def _intro(self) -> Text:
        if self.ckpt is None:
            return Text(
                "h: check every tensor of the shown tag (NaN, Inf, norms, moments, drift).", style="italic"
            )
        from inspector.health.stream import plan_jobs

        nbytes = sum(j.nbytes for j in plan_jobs(self.ckpt, self.ckpt.tensors, None))
        return Text(
            f"h: check every tensor of {shown(self.ckpt.tag)}: NaN/Inf, zeros, norms against their siblings, "
            f"both Adam moments (src m: exp_avg, v: exp_avg_sq), the 16-bit copy, and the change since the tag "
            f"chosen above "
            f"(reads {size(nbytes)}, more with a comparison; the keys keep working, escape cancels).",
            style="italic",
        )
