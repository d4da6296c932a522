"""Hostile text for the text-out tests: one sample of each character class a terminal obeys or that hides or
reorders text, and the check that none reached an output raw."""

from __future__ import annotations

import unicodedata

# one character or sequence of each class a terminal obeys or that hides or reorders text
CONTROLS = {
    "C0 BEL": "\x07",
    "C0 CR": "\r",
    "C0 backspace": "\x08",
    "ESC CSI clear": "\x1b[2J",
    "ESC OSC 52 clipboard": "\x1b]52;c;aGVsbG8=\x07",
    "ESC OSC title": "\x1b]0;PWNED\x1b\\",
    "DEL": "\x7f",
    "C1 CSI": "\x9b2J",
    "C1 OSC": "\x9d0;x\x9c",
    "bidi override": "\u202etxt.exe",
    "bidi isolate": "\u2066x\u2069",
    "zero width": "a\u200bb",
    "line separator": "\u2028",
    "BOM": "\ufeff",
    "lone surrogate": "\ud800",
}


def raw_controls(text: str, *, newlines: bool = False) -> list[str]:
    """The characters of `text` a terminal would obey (or that hide text), newlines allowed if asked."""
    bad = {"Cc", "Cf", "Zl", "Zp", "Cs"}
    return [c for c in text if unicodedata.category(c) in bad and not (newlines and c == "\n")]
