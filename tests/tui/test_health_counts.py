"""Health progress counts one unit from start to end (#28 item 11): the first status line already knows how
many streams the pass will read, and the last one says the same number."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from rich.text import Text

from inspector.tui.app import make_app
from inspector.tui.screens.health import HealthPane
from tests.tui.conftest import scanned, wait_for

pytestmark = pytest.mark.asyncio


async def test_the_stream_count_is_known_up_front(small_demo: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    lines: list[str] = []
    real = HealthPane._status

    def status(self: HealthPane, line: Text | str) -> None:
        lines.append(line.plain if isinstance(line, Text) else Text.from_markup(line).plain)
        real(self, line)

    monkeypatch.setattr(HealthPane, "_status", status)
    app = make_app(path=str(small_demo), live_meters=False)
    async with app.run_test(size=(120, 36)) as pilot:
        await scanned(pilot)
        await pilot.press("h")
        pane = app.main.health_pane
        await wait_for(pilot, lambda: pane.report is not None, "the health pass")
        totals = {int(m.group(1).replace(",", "")) for x in lines if (m := re.search(r"of ([\d,]+) streams?", x))}
        assert len(totals) == 1, lines  # one total from the first progress line on
        final = re.search(r"([\d,]+) streams? read", lines[-1])
        assert final and int(final.group(1).replace(",", "")) == totals.pop(), lines[-1]
