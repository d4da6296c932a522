"""`?` (#28 item 19): the keys of the screen you are on come first, and fit an 80x24 terminal."""

from __future__ import annotations

import html
import re
from pathlib import Path

import pytest

from inspector.tui.app import make_app
from inspector.tui.screens.help import KEYS, HelpScreen
from tests.tui.conftest import scanned, wait_for

pytestmark = pytest.mark.asyncio


def _screen_text(svg: str) -> str:
    """The characters of a screenshot, without the SVG around them."""
    return html.unescape(re.sub(r"<[^>]+>", "", svg)).replace("\xa0", " ")


@pytest.mark.parametrize("tab,section", [("t", "Tensors"), ("h", "Health")])
async def test_help_starts_with_this_screen(small_demo: Path, tab: str, section: str) -> None:
    app = make_app(path=str(small_demo), live_meters=False)
    async with app.run_test(size=(80, 24)) as pilot:
        await scanned(pilot)
        await pilot.press(tab)
        await pilot.press("question_mark")
        await wait_for(pilot, lambda: isinstance(app.screen, HelpScreen) and app.screen.is_mounted, "help")
        await pilot.pause()
        assert app.screen.here == section
        from inspector.tui.screens.help import keys_table

        rows = keys_table(section).columns[0]._cells
        assert f"{section} (this screen)" in rows[0]
        screen = _screen_text(app.export_screenshot())
        for _key, what in dict(KEYS)[section]:  # every key of this screen on the first page at 80x24
            assert what[:24] in screen, what
