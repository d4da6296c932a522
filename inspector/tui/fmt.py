"""Small text helpers shared by the widgets (sizes, counts, shapes, bars)."""

from __future__ import annotations

import os

from rich.markup import escape

from inspector.format.dtypes import SHORT_NAMES
from inspector.scan.model import Kind
from inspector.system.units import format_bytes, format_count, plural, printable

KIND_STYLE = {Kind.TRAINABLE: "green", Kind.FROZEN: "cyan", Kind.BUFFER: "magenta", Kind.TIED: "yellow"}


def shown(text: object) -> str:
    """The one way a string from a file or a folder name reaches the screen: Textual writes control characters
    raw, so ESC, BEL and the C1 range are shown as `\\x1b` (a folder named `ESC ] 2 ; ... BEL` would otherwise
    set the terminal's title). For Rich `Text`, Select options, titles and dialogs (no markup parsed there)."""
    return printable(str(text))


def shown_markup(text: object) -> str:
    """`shown`, for a string that goes into Textual markup: `[` escaped too, so a name is never read as a style."""
    return escape(shown(text))


def size(n: float) -> str:
    return format_bytes(n)


count = format_count  # 1,234 · 12.3M · 1.20B, as the CLI shows them
__all__ = ["plural"]  # 1 tensor, 2 tensors: re-exported for the widgets, one rule with the CLI


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
