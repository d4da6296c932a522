"""Live memory meter: the child's RSS now and at peak, a history sparkline, available memory and the
predicted peak as a reference mark on the bar.

The sparkline shares the bar's scale (zero to a little above the predicted peak). Textual's Sparkline scales
from the smallest to the largest sample, so a converter holding flat at 40 MiB drew a full-height wall, the
same picture as one about to run out of memory."""

from __future__ import annotations

from collections import deque

from rich.text import Text
from textual.app import ComposeResult
from textual.reactive import reactive
from textual.widget import Widget
from textual.widgets import Static

from inspector.tui.fmt import size
from inspector.tui.widgets.auto_height import AutoHeightStatic

HISTORY = 240
EIGHTHS = " ▁▂▃▄▅▆▇█"
SPARK_ROWS = 2


def _scale(rss: int, peak: int, predicted: int) -> float:
    """The meter's full width: room above the predicted peak, and above anything actually seen."""
    return max(predicted * 1.25, peak * 1.05, rss * 1.05, 1)


def sparkline(history: list[int], scale: float, predicted: int, width: int, rows: int = SPARK_ROWS) -> Text:
    """The last `width` RSS samples as `rows` lines of block characters, zero at the bottom, on `scale`;
    a column above the predicted peak is red."""
    samples = history[-width:]
    samples = [0] * (width - len(samples)) + samples  # newest at the right, as the history grows
    levels = [min(rows * 8, round(v / scale * rows * 8)) for v in samples]
    lines = []
    for row in range(rows - 1, -1, -1):  # top row first
        line = Text()
        for v, lv in zip(samples, levels, strict=True):
            cell = EIGHTHS[max(0, min(8, lv - row * 8))]
            line.append(cell, style="red" if predicted and v > predicted else "green")
        lines.append(line)
    return Text("\n").join(lines)


def meter_bar(rss: int, peak: int, predicted: int, width: int) -> Text:
    """`████▌····│·····` : RSS filled, peak as ▏, predicted peak as │, scaled to fit all three."""
    scale = _scale(rss, peak, predicted)
    cells = ["·"] * width
    fill = int(rss / scale * width)
    for i in range(min(fill, width)):
        cells[i] = "█"
    text = Text()
    mark_pred = min(width - 1, int(predicted / scale * width)) if predicted else -1
    mark_peak = min(width - 1, int(peak / scale * width)) if peak else -1
    for i, c in enumerate(cells):
        if i == mark_pred:
            text.append("│", style="bold yellow")
        elif i == mark_peak and c != "█":
            text.append("▏", style="bold magenta")
        else:
            over = predicted and i >= mark_pred
            text.append(c, style=("red" if over else "green") if c == "█" else "dim")
    return text


class MemoryMeter(Widget):
    """Feed with `add_sample(rss, available)`; `predicted` is the preflight's reference."""

    DEFAULT_CSS = """
    MemoryMeter { height: auto; }
    MemoryMeter #meter-spark { height: 2; }  /* SPARK_ROWS */
    """

    rss: reactive[int] = reactive(0, layout=False)
    """Resident memory of the child now (bytes)."""
    peak: reactive[int] = reactive(0)
    """Highest RSS seen (or reported by the child at its end)."""
    available: reactive[int] = reactive(0)
    """Memory the machine (or its tightest limit) has available now."""
    predicted: reactive[int] = reactive(0)
    """Preflight's predicted peak: the reference mark."""

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.history: deque[int] = deque(maxlen=HISTORY)

    def compose(self) -> ComposeResult:
        yield AutoHeightStatic(id="meter-text")
        yield Static(id="meter-spark")

    def on_mount(self) -> None:
        self._draw()

    def add_sample(self, rss: int, available: int) -> None:
        self.history.append(rss)
        self.set_reactive(MemoryMeter.rss, rss)  # one redraw per sample, not one per changed figure
        self.set_reactive(MemoryMeter.peak, max(self.peak, rss))
        self.set_reactive(MemoryMeter.available, available)
        self._draw()

    def on_resize(self) -> None:
        """Redraw at the new width: a finished run gets no more samples, and a bar drawn for 120 columns
        wrapped onto a line of dots at 80 (issue 42)."""
        self._draw()

    def watch_rss(self) -> None:
        self._draw()

    def watch_peak(self) -> None:
        self._draw()

    def watch_predicted(self) -> None:
        self._draw()

    def _draw(self) -> None:
        if not self.is_mounted:
            return
        width = max(10, self.size.width - 2) if self.size.width else 40
        head = Text.assemble(
            ("RSS ", "bold"),
            (size(self.rss), "bold green"),
            ("  peak ", "bold"),
            (size(self.peak), "bold magenta"),
            ("  predicted ", "bold"),
            (size(self.predicted) if self.predicted else "–", "bold yellow"),
            ("  available ", "bold"),
            size(self.available) if self.available else "–",
        )
        self.query_one("#meter-text", Static).update(
            Text("\n").join([head, meter_bar(self.rss, self.peak, self.predicted, width)])
        )
        scale = _scale(self.rss, self.peak, self.predicted)
        self.query_one("#meter-spark", Static).update(
            sparkline(list(self.history), scale, self.predicted, width), layout=False
        )
