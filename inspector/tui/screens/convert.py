"""Convert (`c`): preflight, then `python -m inspector convert ... --progress json` in a child process.

Progress, per-shard progress, current tensor, throughput and ETA come from the child's JSON lines; the
memory meter samples the child's RSS. `escape` cancels (SIGINT: the converter removes its partial output);
a failed or killed child is explained, with what it left on disk. At the end `v` verifies in another child.
"""

from __future__ import annotations

from enum import Enum

from rich.text import Text
from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.widgets import Header, Static

from inspector.convert.events import Failed, Finished, Progressed, Started, Verified
from inspector.convert.kinds import Job
from inspector.convert.options import ConvertOptions
from inspector.convert.order import to_json
from inspector.convert.preflight import Assessment
from inspector.errors import InspectorError
from inspector.tui.fmt import plural, shown, size, took
from inspector.tui.jobs import (
    app_order,
    child_args,
    done_text,
    explain_exit,
    failure_text,
    plan_mismatch,
    verified_text,
)
from inspector.tui.messages import ChildEvent, ChildExited, Preflighted
from inspector.tui.screens.child_screen import ChildScreen
from inspector.tui.screens.dialogs import ConfirmDialog
from inspector.tui.typed import zi
from inspector.tui.widgets.auto_height import AutoHeightStatic
from inspector.tui.widgets.keybar import KeyBar
from inspector.tui.widgets.meter import MemoryMeter
from inspector.tui.widgets.progress import ConvertProgress


class Phase(str, Enum):
    """Where a conversion on this screen stands; every key's meaning follows from it."""

    PREFLIGHT = "preflight"  # predicting; nothing started
    RUNNING = "running"
    CANCELLING = "cancelling"  # interrupt sent; the child is cleaning up
    DONE = "done"
    FAILED = "failed"
    CANCELLED = "cancelled"
    VERIFYING = "verifying"
    VERIFIED = "verified"


class ConvertScreen(ChildScreen):
    BINDINGS = [
        Binding("escape", "cancel", "Cancel / back"),
        Binding("v", "verify", "Verify"),
        Binding("b", "back", "Back"),
    ]

    def __init__(self, *, force: bool = False, autostart: bool = True) -> None:
        super().__init__()
        self.force = force
        self.autostart = autostart
        self._phase = Phase.PREFLIGHT
        self.plan: Job | None = None
        self.assessment: Assessment | None = None
        self.out_dir = ""
        self.report: Finished | Verified | None = None
        self.error_event: Failed | None = None

    def compose(self) -> ComposeResult:
        yield Header()
        with Vertical(id="convert-body"):
            yield AutoHeightStatic("", id="convert-title")
            yield ConvertProgress()
            yield Static("Memory of the converter process", classes="section")
            yield MemoryMeter(id="meter")
            yield AutoHeightStatic("", id="result")
        yield KeyBar()

    def on_mount(self) -> None:
        app = zi(self)
        self.sub_title = "Convert"
        self.out_dir = app.export.out_dir
        app.converting = True
        self.query_one("#convert-title", Static).update(Text("Checking that it fits…", style="italic"))
        if self.autostart:
            self._preflight(app.convert_options(), self.out_dir)
        if app.live_meters:
            self.set_interval(0.25, self._sample)

    def on_unmount(self) -> None:
        self.stop_child()
        zi(self).converting = False

    # --- preflight, then start ----------------------------------------------------------------------------

    @work(thread=True, exclusive=True, group="preflight", exit_on_error=False, description="preflight")
    def _preflight(self, opts: ConvertOptions, out_dir: str) -> None:
        from inspector.tui.jobs import run_preflight

        try:
            plan, a = run_preflight(self.app, opts, out_dir)
        except InspectorError as exc:
            self.post_message(Preflighted(None, None, exc))
            return
        self.post_message(Preflighted(plan, a))

    @on(Preflighted)
    def _preflighted(self, msg: Preflighted) -> None:
        if msg.error is not None or msg.plan is None or msg.assessment is None:
            self._fail(
                msg.error.title if msg.error else "Cannot plan",
                msg.error.message if msg.error else "",
                msg.error.hint if msg.error else "",
            )
            return
        self.plan, self.assessment = msg.plan, msg.assessment
        self.query_one(MemoryMeter).predicted = msg.assessment.predicted_peak_rss
        if msg.assessment.fits or self.force:
            self.start()
            return

        def answer(yes: bool | None) -> None:
            if yes:
                self.force = True
                self.start()
            else:
                self.phase = Phase.CANCELLED
                zi(self).converting = False
                self.app.pop_screen()

        self.app.push_screen(
            ConfirmDialog(
                "It will not fit",
                f"{msg.assessment.problem}\n→ {msg.assessment.advice}",
                yes="Start anyway",
                no="Back",
            ),
            answer,
        )

    def show_started(self, plan: Job, predicted_peak: int) -> None:
        """The title, totals and reference line of a conversion that has started."""
        ckpt = zi(self).ckpt
        assert ckpt is not None  # a conversion starts only from an open checkpoint
        self.plan = plan
        self.phase = Phase.RUNNING
        self.job = "convert"
        self.query_one(MemoryMeter).predicted = predicted_peak
        self.query_one("#convert-title", Static).update(
            Text.assemble(
                ("Converting ", "bold"),
                shown(f"{ckpt.root} @ {ckpt.tag} → "),
                (shown(plan.where), "bold"),
                f"\n{plural(plan.tensor_count, 'tensor')} · {plural(len(plan.files), 'file')} · {size(plan.output_bytes)}"
                + (" · forced" if self.force else ""),
            )
        )
        self.query_one(ConvertProgress).start(plan.output_bytes, [(f.name, f.nbytes) for f in plan.files])

    def start(self) -> None:
        app = zi(self)
        ckpt, plan = app.ckpt, self.plan
        assert ckpt is not None and plan is not None and self.assessment is not None
        self.show_started(plan, self.assessment.predicted_peak_rss)
        order = app_order(app, self.out_dir, force=self.force)  # the child plans from it, not from argv
        self._spawn(child_args(order), to_json(order))

    # --- events from the child ----------------------------------------------------------------------------

    @on(ChildEvent)
    def _child_event(self, msg: ChildEvent) -> None:
        ev = msg.event
        if isinstance(ev, Started) and self.plan is not None and (problem := plan_mismatch(ev, self.plan)):
            self.stop_child()  # not the job the user was shown: it does not go on
            self._fail("The converter planned something else", problem, "Go back (b) and convert again.")
        elif isinstance(ev, Progressed):
            self.show_progress(ev)
        elif isinstance(ev, Finished | Verified):
            self.report = ev
        elif isinstance(ev, Failed):
            self.error_event = ev

    def show_progress(self, ev: Progressed) -> None:
        self.query_one(ConvertProgress).show(ev, verifying=self.job == "verify")

    @on(ChildExited)
    def _child_exited(self, msg: ChildExited) -> None:
        meter = self.query_one(MemoryMeter)
        reported = self.report.peak_rss if isinstance(self.report, Finished) else 0
        peak = reported or (self.child.peak_rss if self.child else 0)
        meter.peak = max(meter.peak, peak)
        if msg.job == "verify":
            self._verify_done(msg)
            return
        zi(self).converting = False
        if self.phase is Phase.FAILED:  # stopped by the app (a plan that is not the preview): said already
            return
        if msg.returncode == 0 and isinstance(self.report, Finished):
            self.phase = Phase.DONE
            progress = self.query_one(ConvertProgress)
            reused = self.report.resumed_files
            progress.written(reused)
            # the last progress line said "under a second left": now it says what was done, reuse included
            again = f", {plural(reused, 'file')} of it reused from an earlier run" if reused else ""
            progress.say(f"{size(self.report.bytes_written)} written in {took(self.report.seconds)}{again}")
            result = self.query_one("#result", Static)
            result.update(
                Text.assemble(
                    self._left_out(),
                    done_text(
                        self.report,
                        peak,
                        meter.predicted,
                        len(self.plan.files) if self.plan is not None else 0,
                    ),
                )
            )
            self.call_after_refresh(result.scroll_visible, animate=False)
            self.notify("Conversion finished.", title="Done")
            return
        cancelled = msg.returncode == 130 or self.phase is Phase.CANCELLING
        if cancelled:  # "Cancelling: …" (present, with an ellipsis) said above "■ Cancelled" once it had ended
            self.query_one(ConvertProgress).say(f"Cancelled: {self.cancel_words()}.")
        self.phase = Phase.CANCELLED if cancelled else Phase.FAILED
        title, message, hint = explain_exit(
            msg.returncode,
            cancelled,
            self.error_event,
            msg.stderr,
            peak,
            self.out_dir,
            resumable=self.plan is not None and self.plan.keeps_on_cancel,
        )
        self._show_failure(title, message, hint, error=not cancelled)

    def _left_out(self) -> Text:
        """A forced conversion of a damaged checkpoint: what the scan could not read is not in the output."""
        ckpt = zi(self).ckpt
        if not self.force or ckpt is None or not ckpt.errors:
            return Text()
        return Text.assemble(
            ("⚠ Forced: what the scan could not read is left out of this output.\n", "bold yellow"),
            *(Text(f"  {shown(e.message)}\n", style="yellow") for e in ckpt.errors),
        )

    def _show_failure(self, title: str, message: str, hint: str, error: bool = True) -> None:
        result = self.query_one("#result", Static)
        title, message, hint = shown(title), shown(message), shown(hint)
        result.update(failure_text(title, message, hint, error=error))
        self.call_after_refresh(result.scroll_visible, animate=False)
        self.notify(
            message[:200], title=title, severity="error" if error else "warning", timeout=8, markup=False
        )

    @property
    def phase(self) -> Phase:
        return self._phase

    @phase.setter
    def phase(self, value: Phase) -> None:
        self._phase = value
        if self.is_mounted:
            self.refresh_bindings()  # the key bar offers what the new phase allows (v once it is done)

    @property
    def busy(self) -> bool:
        """A conversion or verification of this screen is under way (a finished one further down the stack is
        not what quitting would cancel)."""
        running = self.child is not None and self.child.running
        return running or self.phase in (Phase.PREFLIGHT, Phase.RUNNING, Phase.CANCELLING)

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        """`v` is offered once there is a finished conversion to verify."""
        if action == "verify":
            return self.phase in (Phase.DONE, Phase.VERIFIED, Phase.VERIFYING)
        return True

    def _fail(self, title: str, message: str, hint: str = "") -> None:
        if self.phase is Phase.PREFLIGHT:  # not "Checking that it fits…" forever
            self.query_one("#convert-title", Static).update(
                Text.assemble(("✖ Not started: ", "bold red"), shown(title))
            )
        self.phase = Phase.FAILED
        zi(self).converting = False
        self._show_failure(title, message, hint)

    # --- verify -------------------------------------------------------------------------------------------

    def action_verify(self) -> None:
        if self.phase is not Phase.DONE:
            self.notify("Verify runs once the conversion has finished.", severity="warning")
            return
        app = zi(self)
        assert app.ckpt is not None  # verify follows a conversion of the open checkpoint
        self.phase = Phase.VERIFYING
        self.job = "verify"
        self.report = None
        progress = self.query_one(ConvertProgress)
        progress.start(None)
        progress.say("Verifying: re-reading every source slice…")
        self._spawn(
            [
                "verify",
                app.ckpt.root,
                self.out_dir,
                "--tag",
                app.ckpt.tag,
                "--progress",
                "json",
                *(f"--tp-split={glob}={rule}" for glob, rule in app.tp_split),  # scanned as it was converted
            ]
        )

    def _verify_done(self, msg: ChildExited) -> None:
        r = self.report if isinstance(self.report, Verified) else None
        if msg.returncode == 0 and r is not None and r.ok:
            self.phase = Phase.VERIFIED
            progress = self.query_one(ConvertProgress)
            progress.complete()
            progress.say(verified_text(r))
            self.notify("Every output byte matches the checkpoint.", title="Verified")
            return
        self.phase = Phase.DONE
        lists = (
            (("mismatched", r.mismatched), ("missing", r.missing), ("unexpected", r.unexpected)) if r else ()
        )
        bad = [f"{k}: {', '.join(names[:5])}" for k, names in lists if names]
        said = self.error_event.message if self.error_event else ""
        self._show_failure("Verification failed", "; ".join(bad) or said or msg.stderr[-500:], "")

    # --- cancel and leave ---------------------------------------------------------------------------------

    def action_cancel(self) -> None:
        if self.child is None or not self.child.running:
            self.action_back()
            return

        def answer(yes: bool | None) -> None:
            child = self.child
            if child is None or not child.running:  # it ended in the instant before it was held
                self.notify(
                    "The conversion had already ended before you answered; see the result below.",
                    title="Already finished",
                )
                return
            if yes:
                self.phase = Phase.CANCELLING
                self.query_one(ConvertProgress).say(f"Cancelling: {words}…")
                child.interrupt()  # delivered as it resumes: no byte is written in between
                child.resume()
                self.set_timer(10, self._escalate)
            else:
                child.resume()

        words = self.cancel_words()
        self.pause_child()
        self.app.push_screen(
            ConfirmDialog(
                "Cancel the conversion?",
                f"{self.held_words()} Cancelling: {words}.",
                yes="Cancel it",
                no="Keep going",
            ),
            answer,
        )

    def cancel_words(self) -> str:
        words = self.plan.cancelled_words() if self.plan is not None else "partial output is removed"
        return f"every Ray task is stopped; {words}" if self.on_ray else words

    def action_back(self) -> None:
        if self.child is not None and self.child.running:
            self.notify("Still running: escape cancels it first.", severity="warning")
            return
        from inspector.tui.screens.export import ExportScreen

        self.app.pop_screen()
        if isinstance(
            self.app.screen_stack[-1], ExportScreen
        ):  # back to the checkpoint, as help says, not the form
            self.app.pop_screen()
