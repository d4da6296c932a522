"""The convert screen's drawings: the memory meter (one zero-based scale for bar and sparkline), the file list."""

from __future__ import annotations

from inspector.tui.widgets.meter import meter_bar, sparkline
from inspector.tui.widgets.progress import shard_rows

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


def test_output_files_list_marks_written_current_and_to_come() -> None:
    files = [(f"model-{i:05d}-of-00003.safetensors", 2 * MiB) for i in range(1, 4)]
    lines = shard_rows(files, current=1, fraction=0.42).plain.splitlines()
    assert [ln.split()[0] for ln in lines] == ["✔", "▶", "·"]
    assert lines[1].endswith("42%")


def test_many_output_files_keep_the_current_one_in_view() -> None:
    files = [(f"model-{i:05d}-of-00030.safetensors", MiB) for i in range(1, 31)]
    lines = shard_rows(files, current=20, fraction=0.5, rows=8).plain.splitlines()
    assert len(lines) == 8
    assert lines[0] == "  ✔ 18 earlier files written"
    assert any("▶ model-00021-of-00030" in ln for ln in lines)
    assert lines[-1] == "  · 6 more files to come"
    last = shard_rows(files, current=30, fraction=1.0, rows=8).plain.splitlines()  # all written
    assert len(last) <= 8 and "to come" not in last[-1] and "model-00030-of-00030" in last[-1]
