"""Times and parameter counts in words (humanize, through tui/fmt.py) and where the app shows them: the
overview's parameter total and how long ago the tag was saved, measured on the app's clock, frozen in tests."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from inspector.scan.scanner import scan
from inspector.scan.summary import parameter_count
from inspector.tui.app import make_app
from inspector.tui.fmt import ago, estimate, in_words, took
from inspector.tui.widgets.summary import SummaryCard
from tests.tui.conftest import plain, scanned


def test_estimates_are_words_and_say_when_unknown() -> None:
    assert estimate(float("nan")) == "–" and estimate(-1) == "–" and estimate(float("inf")) == "–"
    assert estimate(0.3) == "under a second"
    assert (estimate(45), estimate(150), estimate(3 * 3600)) == ("45 seconds", "2 minutes", "3 hours")


def test_finished_durations_keep_their_precision() -> None:
    assert took(0.04) == "under a tenth of a second" and took(0.06) == "0.1 seconds"
    assert took(3.44) == "3.4 seconds"
    assert took(65.3) == "1 minute and 5 seconds"
    assert took(2 * 3600 + 3 * 60 + 7) == "2 hours, 3 minutes and 7 seconds"


def test_ages_and_counts_in_words() -> None:
    assert (ago(3 * 3600 + 100), ago(40 * 86400), ago(-120)) == (
        "3 hours ago",
        "a month ago",
        "2 minutes from now",
    )
    assert in_words(999_999) == ""  # the figure alone reads fine
    assert (in_words(2_011_987), in_words(7_241_732_096)) == ("2.0 million", "7.2 billion")


T0 = 1_700_000_000  # when the copied demo's files say they were written


@pytest.fixture
def dated_demo(small_demo: Path, tmp_path: Path) -> Path:
    """A copy of the small demo whose rank files were all last written at T0."""
    root = tmp_path / "dated"
    shutil.copytree(small_demo, root)
    for f in scan(str(root)).files:
        os.utime(f.path, (T0, T0))
    return root


@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("live", "clock", "said"),
    [
        (True, T0 + 2 * 3600 + 30, "2 hours ago"),
        (True, T0 + 40 * 86400, "a month ago"),
        (False, T0 + 50 * 86400, "3 hours ago"),
    ],
)
async def test_the_overview_says_how_long_ago_the_tag_was_saved(
    dated_demo: Path, live: bool, clock: float, said: str
) -> None:
    """Measured on the app's clock from the files' times; a frozen app (tests, screenshots) says the same age
    whatever the clock and the files say."""
    app = make_app(path=str(dated_demo), live_meters=live)
    app.clock = lambda: clock
    async with app.run_test(size=(120, 36)) as pilot:
        await scanned(pilot)
        card = plain(app.main.query_one(SummaryCard))
        assert f"Saved       {said}" in card, card


@pytest.mark.asyncio
async def test_the_overview_shows_the_exact_parameter_total_and_its_words(small_demo: Path) -> None:
    app = make_app(path=str(small_demo), live_meters=False)
    async with app.run_test(size=(80, 24)) as pilot:
        await scanned(pilot)
        assert app.ckpt is not None
        n = parameter_count(app.ckpt)
        assert n >= 1_000_000  # the demo is big enough to have words
        card = plain(app.main.query_one(SummaryCard))
        assert f"Parameters  {n:,} ({in_words(n)})" in card, card
