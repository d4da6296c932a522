"""The Textual layout race behind the overview's short tables, reproduced without timing luck.

A widget asks for a layout (`_layout_required` is set; only its own idle handler clears it). Before it gets
to idle, another widget's layout makes the screen measure it: its box model is cached under its current
`_layout_updates`. Its content then changes: `refresh(layout=True)` does not bump `_layout_updates`, since a
layout is already pending, so every later layout reuses the old height. The overview met this when a scan
finished before its freshly mounted widgets had first gone idle (a loaded machine). Here the widget's queue
is held busy on purpose instead. See inspector/tui/widgets/auto_height.py.
"""

from __future__ import annotations

import asyncio

import pytest
from textual.app import App, ComposeResult
from textual.containers import VerticalScroll
from textual.message import Message
from textual.widgets import Static

from inspector.tui.widgets.auto_height import AutoHeightStatic

pytestmark = pytest.mark.asyncio


class Hold(Message):
    def __init__(self, release: asyncio.Event) -> None:
        super().__init__()
        self.release = release


class HeldStatic(Static):
    async def on_hold(self, msg: Hold) -> None:
        await msg.release.wait()  # this widget's queue is busy: no idle, so its layout request stays pending


class HeldAuto(AutoHeightStatic):
    async def on_hold(self, msg: Hold) -> None:
        await msg.release.wait()


class Race(App[None]):
    def __init__(self, cls: type[Static]) -> None:
        super().__init__()
        self.cls = cls

    def compose(self) -> ComposeResult:
        with VerticalScroll():
            yield Static("", id="other")
            yield self.cls("", id="late")


async def _until(predicate, what: str) -> None:  # type: ignore[no-untyped-def]
    for _ in range(400):  # plain sleeps: a pilot pause would wait for the held widget to go idle
        if predicate():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"gave up waiting for {what}")


async def _height_after_race(cls: type[Static]) -> int:
    app = Race(cls)
    async with app.run_test(size=(40, 20)) as pilot:
        await pilot.pause()
        late, other = app.query_one("#late", Static), app.query_one("#other", Static)
        release = asyncio.Event()
        late.post_message(Hold(release))
        await _until(lambda: late._layout_required is False, "the held widget to idle")
        await asyncio.sleep(0.05)  # it is now inside on_hold
        late.update("x")  # a layout request that stays pending while the widget is held
        assert late._layout_required
        other.update("a\nb")  # the other widget's layout measures `late` now, at one row
        await _until(lambda: other.size.height == 2, "the screen to lay out the other widget")
        late.update("1\n2\n3")  # three rows, while the first request is still pending
        release.set()
        await pilot.pause()
        await pilot.pause(0.1)
        return late.size.height


async def test_textual_keeps_the_old_height_of_a_plain_static() -> None:
    """Textual's own behaviour. If this fails after a Textual upgrade, the race is fixed upstream and
    AutoHeightStatic can go (check the snapshot tests under load without it)."""
    assert await _height_after_race(HeldStatic) == 1


async def test_auto_height_static_is_measured_again() -> None:
    assert await _height_after_race(HeldAuto) == 3
