"""The memory meter's drawings: one scale for the bar and the sparkline, zero at the bottom."""

from __future__ import annotations

from inspector.tui.widgets.meter import meter_bar, sparkline

MiB = 2**20


def test_flat_memory_draws_a_flat_line_at_its_height_not_a_wall() -> None:
    # 40 MiB held flat against a 100 MiB prediction (scale 125 MiB): about a third of two rows of eighths
    text = sparkline([40 * MiB] * 30, 125 * MiB, 100 * MiB, width=30)
    top, bottom = text.plain.split("\n")
    assert top == " " * 30
    assert bottom == "▅" * 30  # 40/125 of 16 eighths = 5


def test_sparkline_grows_from_the_right_and_marks_what_exceeds_the_prediction() -> None:
    text = sparkline([0, 125 * MiB, 110 * MiB], 125 * MiB, 100 * MiB, width=6)
    top, bottom = text.plain.split("\n")
    assert top == "    █▆" and bottom == "    ██"  # three columns of no history, then 0, 16/16, 14/16 eighths
    red = [s for s in text.spans if "red" in str(s.style)]
    assert len(red) == 4  # the two columns above 100 MiB, in both rows


def test_bar_marks_peak_and_prediction_on_the_same_scale() -> None:
    bar = meter_bar(rss=50 * MiB, peak=80 * MiB, predicted=100 * MiB, width=25).plain
    assert bar.index("│") == 20  # 100 of 125 MiB
    assert bar.index("▏") == 16  # 80 of 125
    assert bar.count("█") == 10  # 50 of 125
