"""TUI fixtures: small demo checkpoints (from the shared cache), apps built by the one factory, and waits.

Waits poll the app's own state between pilot pauses; their time limit only guards against a hang (no
test asserts on how long anything took).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

import pytest
from textual.pilot import Pilot

from inspector.demo.writer import DemoSpec, write_demo

SMALL = DemoSpec(params=2_000_000)
HANG_GUARD = 60.0  # seconds; only stops a hung test


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
def snapshot_demo() -> Path:
    """A demo at a fixed path, so snapshots (which show the path) are the same on every run."""
    root = Path(tempfile.gettempdir()) / "zero-inspector-snapshot-demo"
    if not (root / "latest").exists():
        tmp = Path(tempfile.mkdtemp(prefix="zi-snap-"))
        write_demo(str(tmp), DemoSpec(params=2_000_000))
        try:
            os.rename(tmp, root)
        except OSError:  # another xdist worker won the race
            shutil.rmtree(tmp, ignore_errors=True)
    return root


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
