"""Small text helpers shared by the widgets (sizes, counts, shapes, bars, times in words).

Sizes and counts are ours (`system/units.py`: one rule with the CLI and `scan --json`); estimates, finished
durations, ages and parameter counts in words are humanize's (README: "Which formatter says what").
"""

from __future__ import annotations

import math
import os
from datetime import timedelta

import humanize
from rich.markup import escape

from inspector.format.dtypes import SHORT_NAMES
from inspector.scan.model import Kind
from inspector.system.units import format_bytes, format_count, plural
from inspector.text import shown as _shown

KIND_STYLE = {Kind.TRAINABLE: "green", Kind.FROZEN: "cyan", Kind.BUFFER: "magenta", Kind.TIED: "yellow"}


def shown(text: object) -> str:
    """The one way a string from a file or a folder name reaches the screen: the core's text-out rule
    (`text.shown`: secrets redacted; ESC, BEL, C1 and bidi controls shown as `\\x1b`, since Textual
    writes them raw and a folder named `ESC ] 2 ; ... BEL` would otherwise set the terminal's title). For Rich
    `Text`, Select options, titles and dialogs (no markup parsed there)."""
    return _shown(text)


def shown_lines(text: object) -> str:
    """`shown`, line by line: the line breaks of our own messages stay line breaks (not a literal `\\n`)."""
    return "\n".join(shown(line) for line in str(text).split("\n"))


def shown_markup(text: object) -> str:
    """`shown`, for a string that goes into Textual markup: `[` escaped too, so a name is never read as a style."""
    return escape(shown(text))


def size(n: float) -> str:
    return format_bytes(n)


count = format_count  # 1,234 · 12.3M · 1.20B, as the CLI shows them
__all__ = ["plural"]  # 1 tensor, 2 tensors: re-exported for the widgets, the one plural rule with the CLI


def shape(dims: tuple[int, ...]) -> str:
    return "×".join(map(str, dims)) if dims else "scalar"


def dtype(name: str) -> str:
    return SHORT_NAMES.get(name, name)


def bar(fraction: float, width: int) -> str:
    """A block bar with eighth-cell resolution."""
    fraction = min(max(fraction, 0.0), 1.0)
    eighths = round(fraction * width * 8)
    full, part = divmod(eighths, 8)
    out = "█" * full + (" ▏▎▍▌▋▊▉"[part] if part else "")
    return out.ljust(width)


def duration(seconds: float) -> str:
    """A ticking clock, compact (`6s`, `1m05s`, `2h03m`): the elapsed time of a running job, redrawn with each
    event; in words ("1 minute and 5 seconds") it would change length, and wrap, as it counts."""
    if seconds != seconds or seconds < 0:  # NaN
        return "–"
    seconds = round(seconds)
    if seconds < 60:
        return f"{seconds}s"
    m, s = divmod(seconds, 60)
    if m < 60:
        return f"{m}m{s:02d}s"
    h, m = divmod(m, 60)
    return f"{h}h{m:02d}m"


def estimate(seconds: float) -> str:
    """A predicted or remaining time in words ("2 minutes", "an hour"): an estimate is never to the second,
    so it is not written as one; a dash when unknown (no throughput yet)."""
    if not math.isfinite(seconds) or seconds < 0:
        return "–"
    if seconds < 1:
        return "under a second"
    return humanize.naturaldelta(timedelta(seconds=seconds))


def took(seconds: float) -> str:
    """A finished job's time in words, to a tenth of a second below a minute ("3.4 seconds", "1 minute and 5
    seconds", "2 hours, 3 minutes and 7 seconds")."""
    if not math.isfinite(seconds) or seconds < 0:
        return "–"
    if seconds < 0.05:  # precisedelta would say "0 seconds"
        return "under a tenth of a second"
    return humanize.precisedelta(
        timedelta(seconds=seconds), minimum_unit="seconds", format="%0.1f" if seconds < 60 else "%0.0f"
    )


def ago(seconds: float) -> str:
    """How long ago something happened, `seconds` before now ("3 hours ago", "a month ago"); a time ahead of
    the clock (a file from another machine) says so ("2 minutes from now")."""
    return humanize.naturaltime(timedelta(seconds=seconds))


def in_words(n: int) -> str:
    """A parameter count in words from a million up ("1.2 billion"), beside the exact figure, never
    instead of it; "" below a million, where the figure alone reads fine."""
    return humanize.intword(n) if n >= 1_000_000 else ""


def fit_path(path: str, width: int) -> str:
    """`path` in at most `width` cells: whole if it fits, else `…/` and as many of its last folders as fit (the
    checkpoint's own name is what tells runs apart), else the end of its name."""
    if len(path) <= width:
        return path
    parts = path.split(os.sep)
    tail = parts[-1]
    for part in reversed(parts[:-1]):
        if len(f"…{os.sep}{part}{os.sep}{tail}") > width:
            break
        tail = f"{part}{os.sep}{tail}"
    out = f"…{os.sep}{tail}"
    return out if len(out) <= width else "…" + path[len(path) - max(width - 1, 0) :]


def elide_middle(name: str, width: int) -> str:
    """`name` in at most `width` cells with its middle elided, never its end: `model.layers.0.mlp…down_proj.weight`
    keeps both the module it is in and which tensor it is (htop, nvitop); the end gets the larger half."""
    if len(name) <= width:
        return name
    if width <= 1:
        return "…"[:width]
    head = (width - 1) // 2
    return name[:head] + "…" + name[len(name) - (width - 1 - head) :]
