"""A one-line key bar: the screen's active bindings as text, clickable, redrawn in one render.

Textual's Footer rebuilds a widget per key whenever focus moves (about half of a tab switch's CPU time on a
busy 2-core machine); this draws the same hints as one Text, so keys stay quick while a conversion runs.
"""

from __future__ import annotations

from rich.text import Text
from textual import events
from textual.screen import Screen
from textual.widgets import Static


class KeyBar(Static):
    DEFAULT_CSS = """
    KeyBar {
        dock: bottom;
        height: 1;
        background: $footer-background;
        color: $footer-foreground;
    }
    """

    def __init__(self) -> None:
        super().__init__("")
        self._spans: list[tuple[int, int, str]] = []

    def on_mount(self) -> None:
        self.screen.bindings_updated_signal.subscribe(self, self._changed)
        self.call_after_refresh(self._redraw)

    def on_unmount(self) -> None:
        self.screen.bindings_updated_signal.unsubscribe(self)

    def _changed(self, screen: Screen[object]) -> None:
        self._redraw()

    def on_resize(self) -> None:
        self._redraw()  # what fits changes with the width

    def _redraw(self) -> None:
        entries: list[tuple[str, str, bool, str]] = []  # (key shown, description, enabled, key)
        seen: set[str] = set()
        for _node, binding, enabled, _tooltip in self.screen.active_bindings.values():
            if not binding.show or binding.action in seen:
                continue
            seen.add(binding.action)
            entries.append((self.app.get_key_display(binding), binding.description, enabled, binding.key))
        width = self.size.width or self.app.size.width
        # Narrow: first the palette hint goes, then the words of keys everyone knows (q, ?), then the last keys
        # (never `?`, which lists them all): no label is ever cut in the middle.
        for palette, terse in ((True, False), (False, False), (False, True)):
            text = self._draw(entries, palette, terse)
            if text.cell_len <= width:
                break
        while text.cell_len > width and len(entries) > 1:
            drop = next(
                (i for i in range(len(entries) - 1, -1, -1) if entries[i][3] != "question_mark"), None
            )
            if drop is None:
                break
            del entries[drop]
            text = self._draw(entries, False, True)
        self.update(text)

    def _draw(self, entries: list[tuple[str, str, bool, str]], palette: bool, terse: bool) -> Text:
        text = Text(no_wrap=True, overflow="ellipsis")
        self._spans = []
        for shown_key, description, enabled, key in entries:
            start = text.cell_len
            text.append(f" {shown_key} ", style="bold reverse" if enabled else "dim reverse")
            if not (terse and key in ("q", "question_mark")):
                text.append(f" {description} ", style="" if enabled else "dim")
            self._spans.append((start, text.cell_len, key))
        if palette:
            text.append("  ^p palette", style="dim")
            self._spans.append((text.cell_len - 10, text.cell_len, "ctrl+p"))
        return text

    def on_click(self, event: events.Click) -> None:
        for start, end, key in self._spans:
            if start <= event.x < end:
                self.app.simulate_key(key.split(",")[0])
                return
