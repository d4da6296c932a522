"""The app and its one factory, `make_app`, used by the CLI, the tests and the screenshot script.

The app owns what is shared between screens (the roots, the scanned checkpoint, the selection, the export
options) and the scan worker; screens and widgets show it. Nothing here imports torch: scanning is
metadata only, and the conversion runs in a child process.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterable
from dataclasses import replace
from typing import Any

from textual import work
from textual.app import SystemCommand
from textual.binding import Binding
from textual.driver import Driver
from textual.screen import Screen
from textual.worker import Worker, WorkerState

from inspector.convert.kinds import Job
from inspector.convert.options import ConvertOptions, resolve_dtype
from inspector.convert.preflight import Assessment
from inspector.errors import InspectorError
from inspector.remote.roots import absolute, source_at
from inspector.scan.locate import discover_roots
from inspector.scan.model import Checkpoint
from inspector.scan.summary import saved_at
from inspector.scan.tp_rules import Rules
from inspector.text import escape, has_unsafe, shown
from inspector.tui import actions
from inspector.tui.fmt import ago, plural
from inspector.tui.frozen import FROZEN_AGE
from inspector.tui.launch import LaunchOptions, newest_root
from inspector.tui.messages import DemoWritten, Located, ScanFailed, Scanned
from inspector.tui.selections import NamedSelections
from inspector.tui.session import ExportSettings, carried_selection, export_options
from inspector.tui.shell import Shell


class InspectorApp(Shell):
    """zero-inspector's terminal UI."""

    CSS_PATH = "app.tcss"
    TITLE = "zero-inspector"
    ENABLE_COMMAND_PALETTE = True
    # Textual sets these classes on every screen at each resize (a class set once on the app at startup kept
    # the first layout: stacked after enlarging, side by side with cut rows after shrinking)
    HORIZONTAL_BREAKPOINTS = [(0, "narrow"), (100, "wide")]
    VERTICAL_BREAKPOINTS = [(0, "short"), (32, "tall")]
    BINDINGS = [
        Binding("q", "quit_app", "Quit"),
        Binding("question_mark", "help", "Help", key_display="?"),
        Binding("f1", "help", "Help", show=False),
        Binding("e", "export", "Export"),
        Binding("c", "convert", "Convert"),
        Binding("left_square_bracket", "tag(-1)", "Prev tag", show=False, key_display="["),
        Binding("right_square_bracket", "tag(1)", "Next tag", show=False, key_display="]"),
        Binding("r", "roots", "Roots", show=False),
        Binding("y", "yank", "Copy command", show=False),
    ]

    def __init__(self, launch: LaunchOptions, *, live_meters: bool = True) -> None:
        super().__init__()
        self.launch = launch
        self.live_meters = live_meters  # tests and screenshots freeze meters and clocks
        if not live_meters:
            self.animation_level = "none"  # no tab-underline or scroll animations mid-frame in snapshots
        self.roots: tuple[str, ...] = ()
        self.root: str | None = None
        self.latest_tag: str | None = None
        # --- per-checkpoint state: `_forget_checkpoint` resets all of it on every switch (root or tag) ---
        self.ckpt: Checkpoint | None = None  # None while scanning and after a refusal: nothing to export
        self.tags: tuple[str, ...] = ()  # the shown root's tags, known even when the asked-for one is missing
        self.refused: InspectorError | None = None  # why the shown root or tag has no checkpoint
        self.asked_tag: str | None = None  # the tag the last scan asked for (None: the latest)
        self.request = 0  # the last scan asked for: answers of older scans are dropped
        self.selected: set[str] = set()
        self.shown_only: frozenset[str] | None = None  # the `/` filter on: what it shows (`session.exported`)
        self.tp_split: Rules = launch.tp_split  # --tp-split: the scan joins an unrecorded TP split by these
        self._carried: tuple[frozenset[str], bool] | None = None  # a tag switch: (selection, was it all)
        self.named = NamedSelections()  # saved per root in the state file; proposed per checkpoint
        self.set_reactive(InspectorApp.base_options, launch.options or ConvertOptions())
        self.export = ExportSettings(
            out_dir=launch.out_dir or "", overwrite=launch.overwrite, format=launch.format, base=launch.base
        )
        self._default_out = ""  # the output folder last proposed; one the user typed is kept on a tag switch
        self.converting = False
        self._temp_dir: str | None = None
        self._preset_applied = False
        self.scan_seconds: float | None = None
        # tests and the screenshot script replace the machine's figures (RSS, free disk) with fixed ones
        self.frozen_assess: Callable[[Job], Assessment] | None = None
        self.started = time.monotonic()
        # the wall clock "saved … ago" is measured on; tests inject a fixed one (a frozen app uses FROZEN_AGE)
        self.clock: Callable[[], float] = time.time

    # --- screens ------------------------------------------------------------------------------------------

    def get_default_screen(self) -> Screen[None]:
        from inspector.tui.screens.main import MainScreen

        return MainScreen()

    @property
    def main(self):  # type: ignore[no-untyped-def]  # the MainScreen, imported when first asked for
        from inspector.tui.screens.main import MainScreen

        screen = self.screen_stack[0]
        assert isinstance(screen, MainScreen)
        return screen

    def begin(self) -> None:
        """Called by the main screen once it is mounted: open what the command line named."""
        if self.launch.demo:
            self.write_demo()
        elif self.launch.path:
            self.open_path(self.launch.path, self.launch.tag)

    # --- opening and scanning -----------------------------------------------------------------------------

    def open_path(self, path: str, tag: str | None = None) -> None:
        roots = discover_roots(path, source_at(path, "checkpoint"))
        self.roots = roots if len(roots) > 1 else (absolute(path),)  # a bucket URL stays a URL
        self.scan(newest_root(self.roots), tag)

    def scan(self, root: str, tag: str | None = None) -> None:
        """Scan `root` (at `tag`, or its latest) in a worker; a newer request cancels an older one. What was
        shown of the previous checkpoint is gone at once: nothing of it can be exported meanwhile."""
        new_root = root != self.root
        self._forget_checkpoint(new_root=new_root and self.root is not None)
        self.root, self.asked_tag = root, tag
        self.request += 1
        if tag is None or new_root:
            self.latest_tag = None
        self.main.scanning(root, tag)
        self._scan_worker(root, tag, self.request, self.tp_split)

    def set_tp_split(self, rules: Rules) -> None:
        """New TP-split rules (the export form): the shown tag is scanned again with them, as the converter
        child will scan it; the form waits for that scan."""
        self.tp_split = rules
        if self.root is not None:
            self.scan(self.root, self.ckpt.tag if self.ckpt is not None else self.asked_tag)

    def _forget_checkpoint(self, *, new_root: bool) -> None:
        """Every piece of state that belongs to the shown checkpoint, reset. Another tag of the same root
        carries the selection over (the next scan says so when it is not everything); another root starts
        afresh: everything selected, the launch's export options without its include/exclude, the output
        folder proposed for it, overwrite off."""
        if self.ckpt is not None and not new_root:
            every = {t.name for t in self.ckpt.tensors}
            self._carried = (frozenset(self.selected), every <= self.selected)
        elif new_root:
            self._carried = None
        self.ckpt = None
        self.refused = None
        self.scan_seconds = None
        self.selected = set()
        if new_root:
            self.tags = ()
            self._preset_applied = True  # --include/--exclude named tensors of the first root only
            base = self.launch.options or ConvertOptions()
            self.base_options = replace(base, include=(), exclude=())
            self.export = ExportSettings(format=self.export.format, base=self.export.base)  # same run
            self._default_out = ""

    @work(thread=True, exclusive=True, group="scan", exit_on_error=False, description="scan")
    def _scan_worker(self, root: str, tag: str | None, request: int, tp_split: Rules) -> None:
        from inspector.convert.selections import proposed
        from inspector.scan.scanner import find, scan

        start = time.monotonic()
        try:
            self.post_message(Located(find(root, tag), request=request))
            ckpt = scan(root, tag, tp_split=tp_split)
        except InspectorError as exc:
            if tag is not None:  # a tag that is not there: the others stay choosable ([, ], the tag list)
                with contextlib.suppress(InspectorError, OSError):
                    self.post_message(Located(find(root, None), opened=False, request=request))
            self.post_message(ScanFailed(exc, request=request))
            return
        except OSError as exc:
            error = InspectorError(str(exc), title="Cannot read the checkpoint")
            self.post_message(ScanFailed(error, request=request))
            return
        seconds, problem = time.monotonic() - start, self.named.load()
        self.post_message(Scanned(ckpt, seconds, request, proposed(ckpt), problem))

    def on_located(self, msg: Located) -> None:
        if msg.request != self.request:
            return  # an older scan's answer (a thread worker runs on after a newer one starts)
        if self.latest_tag is None:
            self.latest_tag = msg.location.tag
        self.tags = tuple(msg.location.tags) or ((msg.location.tag,) if msg.location.tag else ())
        self.main.located(msg.location, self.latest_tag, opened=msg.opened)

    def on_scanned(self, msg: Scanned) -> None:
        if msg.request != self.request:
            return
        self.ckpt = msg.checkpoint
        self.refused = None
        self.scan_seconds = msg.seconds
        actions.offer_selections(self, msg.offered, msg.state_problem)
        self.selected = self._first_selection(msg.checkpoint)
        default = ExportSettings.default_out(self.ckpt.root, self.ckpt.tag)
        if not self.export.out_dir or self.export.out_dir == self._default_out:
            self.export = replace(self.export, out_dir=default)  # proposed for this root and tag
        self._default_out = default
        self.main.scanned(msg.checkpoint, msg.seconds)
        from inspector.tui.screens.export import ExportScreen

        if isinstance(self.screen, ExportScreen):  # the form waits for a scan with new TP-split rules
            self.screen.rescanned()
        if msg.checkpoint.errors:
            self.notify(
                f"{plural(len(msg.checkpoint.errors), 'problem')} found: see Findings on the overview.",
                title="Damaged checkpoint",
                severity="error",
                timeout=8,
            )

    def _first_selection(self, ckpt: Checkpoint) -> set[str]:
        """The launch's --include/--exclude on the first checkpoint; another tag keeps the selection where
        its names exist (and says so when that is not everything); another root selects everything."""
        names = {t.name for t in ckpt.tensors}
        if not self._preset_applied:
            self._preset_applied = True
            try:
                return actions.preset(self, ckpt, self.launch.selection)
            except InspectorError as exc:
                self.error(exc)
                return names
        carried, self._carried = self._carried, None
        kept = carried_selection(names, carried)
        if kept != names:
            self.notify(
                f"Kept your selection from the previous tag: {len(kept)} of {len(names)} tensors. "
                "`a` on the Tensors tab selects everything.",
                title="Selection carried over",
                timeout=6,
                markup=False,
            )
        return kept

    def on_scan_failed(self, msg: ScanFailed) -> None:
        if msg.request != self.request:
            return
        self.ckpt = None
        self.selected = set()
        self.refused = msg.error
        self.main.failed(msg.error)
        self.error(msg.error)

    def on_worker_state_changed(self, event: Worker.StateChanged) -> None:
        """A worker that died of an unexpected error (our bug) becomes a dialog, not a silent stall."""
        if event.state is WorkerState.ERROR and event.worker.error is not None:
            self.error(actions.worker_error(event.worker.error, event.worker.description))

    def notify(self, message: str, *, title: str = "", **options: Any) -> None:
        """Every notification, from any screen, through the text-out rule (`text.shown`): controls
        escaped and secrets redacted here, so no caller can forget it."""
        super().notify(shown(message, newlines=True), title=shown(title), **options)

    def copy_to_clipboard(self, text: str) -> None:
        """The clipboard is pasted into terminals: never a raw control (nor a surrogate, which OSC 52's UTF-8
        could not carry). A command arrives already `text.shell_command`-quoted; anything else is escaped."""
        super().copy_to_clipboard(escape(text) if has_unsafe(text) else text)

    def error(self, exc: InspectorError) -> None:
        from inspector.tui.screens.dialogs import MessageDialog

        self.push_screen(MessageDialog(exc.title, exc.message, exc.hint))

    # --- demo ---------------------------------------------------------------------------------------------

    @work(thread=True, exclusive=True, group="scan", exit_on_error=False, description="demo")
    def write_demo(self) -> None:
        """Write a demo checkpoint in a child process: hundreds of MB of numpy work would stall the UI."""
        self._temp_dir = tempfile.mkdtemp(prefix="zero-inspector-demo-")
        path = os.path.join(self._temp_dir, "demo-checkpoint")
        self.call_from_thread(
            self.main.status,
            f"Writing a {self.launch.demo_params}-parameter demo checkpoint (ZeRO-2, 2 ranks, bf16)…",
        )
        from inspector.tui.commands import write_demo_checkpoint

        problem = write_demo_checkpoint(path, self.launch.demo_params)
        if problem:
            self.post_message(ScanFailed(InspectorError(problem, title="Cannot write the demo")))
            return
        self.post_message(DemoWritten(path))

    def on_demo_written(self, msg: DemoWritten) -> None:
        self.open_path(msg.path)

    def cleanup(self) -> None:
        if self._temp_dir:
            shutil.rmtree(self._temp_dir, ignore_errors=True)
            self._temp_dir = None

    # --- selection and options ----------------------------------------------------------------------------

    def set_selection(self, names: Iterable[str]) -> None:
        self.selected = set(names)

    def convert_options(self) -> ConvertOptions:
        """The selection as convert's include/exclude, plus the export options."""
        assert self.ckpt is not None
        return export_options(self.ckpt, self.selected, self.shown_only, self.base_options)

    def saved_ago(self, ckpt: Checkpoint) -> str:
        """How long ago `ckpt`'s tag was saved, in words ("3 hours ago"); "" when its files' times are unknown.
        A frozen app (tests, screenshots) says the same age on every run, as its meters stand still."""
        when = saved_at(ckpt)
        if when is None:
            return ""
        return ago(self.clock() - when if self.live_meters else FROZEN_AGE)

    def out_dtype(self) -> str:
        if self.ckpt is None:
            return "float32"
        try:
            return resolve_dtype(self.base_options.dtype, self.ckpt)
        except InspectorError:
            return self.ckpt.compute_dtype

    # --- actions ------------------------------------------------------------------------------------------

    def action_help(self) -> None:
        actions.open_help(self)

    def action_quit_app(self) -> None:
        actions.quit_app(self)

    def stop_children(self) -> None:
        from inspector.tui.screens.convert import ConvertScreen

        for screen in self.screen_stack:
            if isinstance(screen, ConvertScreen):
                screen.stop_child()

    def action_export(self) -> None:
        from inspector.tui.screens.export import ExportScreen

        if actions.need_checkpoint(self) and not isinstance(self.screen, ExportScreen):
            self.push_screen(ExportScreen())

    def action_convert(self) -> None:
        from inspector.tui.screens.convert_start import start_conversion

        if actions.need_checkpoint(self) and not self.converting:
            start_conversion(self)

    def action_yank(self) -> None:
        actions.yank(self)

    def action_tag(self, step: int) -> None:
        actions.step_tag(self, step)

    def action_roots(self) -> None:
        if actions.on_main(self, "switch roots"):
            self.main.focus_roots()

    def get_driver_class(self) -> type[Driver]:
        from inspector.tui.driver import driver_class

        return driver_class() or super().get_driver_class()

    def get_system_commands(self, screen: Screen[object]) -> Iterable[SystemCommand]:
        from inspector.tui.commands import app_commands, textual_commands

        yield from textual_commands(super().get_system_commands(screen))
        yield from app_commands(self)


def make_app(
    launch: LaunchOptions | None = None, *, live_meters: bool = True, **kwargs: object
) -> InspectorApp:
    """The one way to build the app: `make_app(LaunchOptions(path=...))` or `make_app(path=..., tag=...)`."""
    if launch is None:
        launch = LaunchOptions(**kwargs)  # type: ignore[arg-type]
    return InspectorApp(launch, live_meters=live_meters)


def run_app(launch: LaunchOptions) -> int:
    """The CLI's launch hook: run the app in this terminal; returns the exit code."""
    app = make_app(launch)
    try:
        result = app.run()
    finally:
        app.stop_children()
        app.cleanup()
    return int(result or 0)
