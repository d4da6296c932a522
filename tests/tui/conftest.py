"""TUI fixtures: small demo checkpoints (from the shared cache), apps built by the one factory, and waits.

Waits poll the app's own state between pilot pauses; their time limit only guards against a hang (no
test asserts on how long anything took).
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from textual.app import App
from textual.notifications import SeverityLevel
from textual.pilot import Pilot

if TYPE_CHECKING:
    from inspector.tui.launch import LaunchOptions
    from inspector.tui.screens.convert import ConvertScreen

from inspector.demo.writer import DemoSpec, write_demo

SMALL = DemoSpec(params=2_000_000)
HANG_GUARD = 60.0  # seconds; only stops a hung test

# `python -m inspector`, held mid-run: while the gate file exists, every checkpoint read after the second
# waits (announcing itself by touching `<gate>.held`), so a test can cancel or kill a conversion that is
# surely unfinished. SIGINT still raises KeyboardInterrupt as usual; it also lets the held reads go, so the
# converter's own clean-up (which joins its reader threads) runs exactly as it would without the gate.
# With ZI_GATE_JOURNAL set (a journal's path), reads are held only once it records a finished file: a test of
# what a cancel keeps then holds a run that surely has something to keep, whatever the chunk size.
GATED_CHILD = """
import os, signal, sys, threading, time
from inspector.convert.reader import FilePool
gate = os.environ["ZI_GATE"]
journal = os.environ.get("ZI_GATE_JOURNAL")
real = FilePool.read_into
reads = [0]
count = threading.Lock()
interrupted = threading.Event()
def kept():
    if not journal:
        return True
    try:
        with open(journal) as f:
            return len(f.read().splitlines()) > 1  # the first line names the job
    except OSError:
        return False
def held(self, *a):
    with count:
        reads[0] += 1
        n = reads[0]
    while n >= 3 and os.path.exists(gate) and not interrupted.is_set() and kept():
        open(gate + ".held", "a").close()
        time.sleep(0.01)
    return real(self, *a)
def on_sigint(signum, frame):
    interrupted.set()
    signal.default_int_handler(signum, frame)
FilePool.read_into = held
signal.signal(signal.SIGINT, on_sigint)
from inspector.cli.main import entry
entry()
"""


@pytest.fixture(scope="session")
def small_demo(demo) -> Path:  # type: ignore[no-untyped-def]
    return demo(SMALL)


@pytest.fixture(scope="session")
def two_tag_demo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A root with two tags (global_step3, global_step5); `latest` names global_step5."""
    root = tmp_path_factory.mktemp("two-tags")
    write_demo(str(root), DemoSpec(params=1_000_000, tag="global_step3"))
    write_demo(str(root), DemoSpec(params=1_000_000, tag="global_step5"))
    return root


@pytest.fixture(scope="session")
def snapshot_demo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A demo at a fixed path, so snapshots (which show the path) are the same on every run: written anew
    each session and copied there unless the copy there has its bytes (one left by older code, whose
    offsets the snapshots would show, is replaced: it once hid a change to the demo's layout)."""
    src = tmp_path_factory.mktemp("snapshot-demo")
    write_demo(str(src), DemoSpec(params=2_000_000))
    return fixed_copy(src, "zero-inspector-snapshot-demo")


class Gate:
    """Holds every conversion child the TUI starts mid-run while `path` exists (see GATED_CHILD)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.held = Path(str(path) + ".held")
        path.touch()

    async def wait_held(self, pilot: Pilot[object]) -> None:
        """Until a child is held at the gate: it has started reading and cannot finish."""
        await wait_for(pilot, self.held.exists, "the child held at the gate")

    def open(self) -> None:
        """Let held and later children run to the end."""
        self.path.unlink(missing_ok=True)
        self.held.unlink(missing_ok=True)


@pytest.fixture
def gate(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Gate]:
    """Child processes of this test run GATED_CHILD instead of `-m inspector` (same arguments, same code);
    the gate starts closed. Test-only: the production Child is unchanged."""
    from inspector.tui.child import Child

    script = tmp_path / "gated_child.py"
    script.write_text(GATED_CHILD)
    g = Gate(tmp_path / "gate")
    monkeypatch.setenv("ZI_GATE", str(g.path))
    # the buffered path, so every read passes the gate (fp32 -> fp32 would otherwise be a kernel copy)
    monkeypatch.setenv("ZI_NO_COPY_FILE_RANGE", "1")
    real_init = Child.__init__

    def gated_init(self: Child, args, on_event, on_exit, stdin=None) -> None:  # type: ignore[no-untyped-def]
        real_init(self, args, on_event, on_exit, stdin)
        assert self.args[1:3] == ["-m", "inspector"], self.args
        self.args = [sys.executable, str(script), *self.args[3:]]

    monkeypatch.setattr(Child, "__init__", gated_init)
    yield g
    g.open()  # a test that failed while a child was held does not leave it waiting


async def wait_for(pilot: Pilot[object], predicate: Callable[[], bool], what: str = "condition") -> None:
    """Pause the pilot until `predicate()` holds (workers and the child run meanwhile)."""
    loop_time = 0.0
    while not predicate():
        await pilot.pause(0.05)
        loop_time += 0.05
        if loop_time > HANG_GUARD:
            raise AssertionError(f"gave up waiting for {what}")


async def scanned(pilot: Pilot[object]) -> None:
    app = pilot.app
    await wait_for(
        pilot,
        lambda: app.ckpt is not None or "-hidden" not in app.main.query_one("#banner").classes,
        "the scan",
    )
    await pilot.pause()


@dataclass(frozen=True)
class Told:
    """One notification as the user got it."""

    message: str
    title: str
    severity: str


def record_notes(app: App[object]) -> list[Told]:
    """Every notification `app` gives from now on, in order. Wraps the public `App.notify` (screens and widgets
    reach it through `self.notify` too); Textual's own list of notifications is private."""
    told: list[Told] = []
    real = app.notify

    def notify(message: str, *, title: str = "", severity: SeverityLevel = "information", **kw: Any) -> None:
        told.append(Told(str(message), title, severity))
        real(message, title=title, severity=severity, **kw)

    app.notify = notify  # type: ignore[method-assign]
    return told


def plain(widget: object) -> str:
    """The text a Static shows (markup and Rich renderables flattened), for "the message is there" checks."""
    import io

    from rich.console import Console

    content = getattr(widget, "_Static__content", "")
    if isinstance(content, str):
        from rich.text import Text

        return Text.from_markup(content).plain
    console = Console(width=1000, file=io.StringIO(), record=True, color_system=None)
    console.print(content)
    return console.export_text()


async def choose_universal(pilot: Pilot[object]) -> str:
    """Open the export options, choose the universal format, wait for its preflight; returns the panel's text."""
    from textual.widgets import Select

    from inspector.tui.screens.export import ExportScreen
    from inspector.tui.widgets.preflight import PreflightPanel

    app = pilot.app
    await pilot.press("e")
    assert isinstance(app.screen, ExportScreen)
    fmt = app.screen.query_one("#format", Select)
    fmt.value = "universal"  # refused (InvalidSelectValueError) unless the form offers it
    await pilot.pause()
    panel = app.screen.query_one(PreflightPanel)
    await wait_for(pilot, lambda: "ds_to_univ" in plain(panel), "the universal preflight")
    return plain(panel)


async def start_held(pilot: Pilot[object], gate: Gate, key: str = "c") -> ConvertScreen:
    """Start the conversion (`key`) and wait until its child is held mid-run at the gate."""
    from inspector.tui.screens.convert import ConvertScreen

    app = pilot.app
    await pilot.press(key)
    await wait_for(
        pilot, lambda: isinstance(app.screen, ConvertScreen) and app.screen.child is not None, "child"
    )
    screen = app.screen
    assert isinstance(screen, ConvertScreen)
    await gate.wait_held(pilot)
    assert screen.phase == "running" and screen.child is not None and screen.child.running
    return screen


async def converted(pilot: Pilot[object]) -> str:
    """`c` on the main screen and the conversion to its end; returns the phase it ended in ("done" or
    "failed"), for the flows that convert from somewhere else (a cluster, a bucket)."""
    from inspector.tui.screens.convert import ConvertScreen

    app = pilot.app
    await pilot.press("c")
    await wait_for(
        pilot,
        lambda: isinstance(app.screen, ConvertScreen) and app.screen.phase in ("done", "failed"),
        "the conversion",
    )
    screen = app.screen
    assert isinstance(screen, ConvertScreen)
    return str(screen.phase.value)


def saved_last(root: Path) -> None:
    """Make `root` the most recently saved checkpoint of its folder (the app opens that one first)."""
    import time

    later = time.time() + 3600
    os.utime(root / "latest", (later, later))


async def exported_fp32(pilot: Pilot[object]) -> str:
    """From the main screen: the export form (`e`) set to fp32, its preflight awaited, the conversion started
    (ctrl+s) and run to its end; returns the phase it ended in ("done" or "failed")."""
    from textual.widgets import Select

    from inspector.tui.screens.convert import ConvertScreen
    from inspector.tui.screens.export import ExportScreen

    app = pilot.app
    await pilot.press("e")
    screen = app.screen
    assert isinstance(screen, ExportScreen)
    screen.query_one("#dtype", Select).value = "fp32"
    await wait_for(pilot, lambda: "Fits" in plain(screen.query_one("#preflight")), "the preflight")
    await pilot.press("ctrl+s")
    await wait_for(
        pilot,
        lambda: isinstance(app.screen, ConvertScreen) and app.screen.phase in ("done", "failed"),
        "convert",
    )
    assert isinstance(app.screen, ConvertScreen)
    return app.screen.phase


def launched(monkeypatch: pytest.MonkeyPatch, *argv: str) -> LaunchOptions:
    """What `zero-inspector open ARGV` hands the app: the terminal run itself, and its refusal of pytest's
    pipes as a terminal, are left out."""
    from inspector.cli.main import build_parser

    seen: list[LaunchOptions] = []
    monkeypatch.setattr("inspector.tui.app.run_app", lambda launch: seen.append(launch) or 0)
    monkeypatch.setattr("inspector.cli.launch._refuse_without_terminal", lambda path: None)
    args = build_parser().parse_args(["open", *argv])
    assert args.func(args) == 0
    return seen[0]


def fixed_copy(src: Path, name: str) -> Path:
    """A copy of `src` at a fixed path (a snapshot shows the path in its header), shared by xdist workers: a
    copy already there with the same files is another worker's, in use, so never removed under it; an older
    fixture's copy is set aside and replaced; a worker that loses the race to publish its copy drops it."""
    import contextlib

    root = Path(tempfile.gettempdir()) / name
    if root.exists() and _same_tree(root, src):
        return root
    if root.exists():
        os.rename(root, aside := Path(tempfile.mkdtemp(prefix="zi-snap-old-")) / "old")
        shutil.rmtree(aside.parent, ignore_errors=True)
    tmp = Path(tempfile.mkdtemp(prefix="zi-snap-")) / "copy"
    shutil.copytree(src, tmp)
    with contextlib.suppress(OSError):  # another worker won the race
        os.rename(tmp, root)
    shutil.rmtree(tmp.parent, ignore_errors=True)
    return root


def _same_tree(a: Path, b: Path) -> bool:
    files = sorted(p.relative_to(b) for p in b.rglob("*") if p.is_file())
    return files == sorted(p.relative_to(a) for p in a.rglob("*") if p.is_file()) and all(
        (a / f).read_bytes() == (b / f).read_bytes() for f in files
    )
