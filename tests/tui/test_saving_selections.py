"""`m` (and the picker's `d`) write the saved-selections file in a worker thread: it is locked and
fsynced, and a slow disk must not freeze the app. The write is held open here to show the UI answering
meanwhile; a write that fails is a warning (the selection kept for the run), a bug in it the error dialog,
never a crash."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
from textual.pilot import Pilot
from textual.widgets import Input

from inspector.convert import selection_store as store
from inspector.errors import OutputError
from inspector.tui.app import make_app
from inspector.tui.screens.dialogs import MessageDialog, NameDialog
from inspector.tui.screens.help import HelpScreen
from inspector.tui.selections import NamedSelections
from tests.tui.conftest import HANG_GUARD, record_notes, scanned, wait_for


async def _name_it(pilot: Pilot[object], name: str) -> None:
    """`m`, a name typed, enter."""
    app = pilot.app
    await pilot.press("m")
    await wait_for(pilot, lambda: isinstance(app.screen, NameDialog), "the name dialog")
    app.screen.query_one(Input).value = name
    await pilot.press("enter")


@pytest.mark.asyncio
async def test_m_writes_in_a_worker_and_the_app_answers_meanwhile(
    small_demo: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = store.save
    started, release = threading.Event(), threading.Event()
    threads: list[threading.Thread] = []

    def held(*args: Any, **kwargs: Any) -> Any:
        threads.append(threading.current_thread())
        started.set()
        release.wait(HANG_GUARD)  # only a guard: the test lets it go (on the UI thread it froze the app)
        return real(*args, **kwargs)

    monkeypatch.setattr(store, "save", held)
    app = make_app(path=str(small_demo), live_meters=False)
    told = record_notes(app)
    async with app.run_test(size=(120, 36)) as pilot:
        await scanned(pilot)
        await _name_it(pilot, "held")
        await wait_for(pilot, started.is_set, "the write")
        assert threads and threads[0] is not threading.main_thread()  # not the UI's thread
        assert app.named.names(app.ckpt.root if app.ckpt else None) == ["held"]  # kept at once
        await pilot.press("question_mark")  # the app answers a key while the file is being written
        await wait_for(pilot, lambda: isinstance(app.screen, HelpScreen), "the help")
        assert not [t for t in told if t.title == "Selection saved"]  # said once it is written, not before
        release.set()
        await wait_for(pilot, lambda: any(t.title == "Selection saved" for t in told), "saved")
    said = next(t for t in told if t.title == "Selection saved")
    assert said.message.startswith("Saved 'held': ") and " tensors. " in said.message
    assert list(store.of_root(store.load(), str(small_demo))) == ["held"]


@pytest.mark.asyncio
async def test_a_failed_write_is_a_warning_and_a_bug_in_it_the_error_dialog(
    small_demo: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def refused(*args: Any, **kwargs: Any) -> Any:
        raise OutputError("The state folder is read-only.", hint="Free it.")

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("a bug")

    app = make_app(path=str(small_demo), live_meters=False)
    told = record_notes(app)
    async with app.run_test(size=(120, 36)) as pilot:
        await scanned(pilot)
        monkeypatch.setattr(store, "save", refused)
        await _name_it(pilot, "kept")
        await wait_for(pilot, lambda: any(t.title == "Selection not written" for t in told), "the warning")
        note = next(t for t in told if t.title == "Selection not written")
        assert note.severity == "warning" and "read-only" in note.message and "this run" in note.message
        assert app.ckpt is not None and app.named.names(app.ckpt.root) == ["kept"]  # kept for the run
        monkeypatch.setattr(store, "save", broken)
        await _name_it(pilot, "bug")
        await wait_for(pilot, lambda: isinstance(app.screen, MessageDialog), "the error dialog")
        assert app.is_running
    assert not [t for t in told if t.title == "Selection saved"]


def test_queued_writes_reach_the_file_in_the_order_they_were_made(tmp_path: Path) -> None:
    """`m` then `d` at once: two workers, whichever runs first takes the oldest change, so the file ends as
    the app shows it (the name removed), not as the later thread to run left it."""
    named = NamedSelections(folder=str(tmp_path))
    named.keep("/runs/a", "x", {"w"})
    named.drop("/runs/a", "x")
    named.keep("/runs/a", "y", {"w"})
    workers = [threading.Thread(target=named.write_next) for _ in range(3)]
    for w in reversed(workers):
        w.start()
    for w in workers:
        w.join()
    assert list(store.of_root(store.load(str(tmp_path)), "/runs/a")) == ["y"] == named.names("/runs/a")
