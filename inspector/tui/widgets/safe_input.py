"""An Input whose picture follows the text-out rule while its value stays the user's to edit.

Textual draws an Input's value as it is, so an output folder prefilled from a checkpoint's folder name (or a
URL with a password) would reach the terminal raw. The picture is `text.masked` of the value: the same
length, so the cursor and the selection stay where they are, unsafe characters as `\ufffd`, secrets as `*`.
"""

from __future__ import annotations

from rich.text import Text
from textual.widgets import Input

from inspector.text import masked


class SafeInput(Input):
    @property
    def _value(self) -> Text:
        if self.password:
            return super()._value
        text = Text(masked(self.value), no_wrap=True, overflow="ignore", end="")
        return self.highlighter(text) if self.highlighter is not None else text
