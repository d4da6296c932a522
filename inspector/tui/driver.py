"""A terminal driver whose escape key answers in ~30 ms instead of 100-200 ms.

A lone ESC byte may be the start of an arrow key's sequence, so a terminal program waits a little before
calling it `escape`. Textual's Linux driver waits `ESCAPE_DELAY` (100 ms), but only notices the wait is over
when its input loop wakes, which it does every 100 ms: escape, the key that cancels, closes and goes back,
answered in 120-150 ms against everything else's 20-30 ms. This driver wakes when the wait ends and waits
30 ms (fish's default; arrow keys arrive in one read, so they stay whole over SSH). A user's ESCDELAY
(milliseconds, as curses reads it) still wins.

The input loop is Textual's own (`LinuxDriver.run_input_thread`) with one change, the select timeout. If a
Textual release moves what it relies on, `driver_class()` falls back to Textual's driver.
"""

from __future__ import annotations

import os
import selectors
from codecs import getincrementaldecoder

from textual.driver import Driver

ESCAPE_DELAY = 0.03
IDLE_WAKE = 0.1  # Textual's own select timeout when nothing is pending


def _wake_in(parser: object, now: float) -> float:
    """Seconds the input loop may sleep: until the parser's pending escape wait ends, else `IDLE_WAKE`."""
    deadline = getattr(parser, "_timeout_time", None)
    if deadline is None:
        return IDLE_WAKE
    return min(IDLE_WAKE, max(0.0, deadline - now))


def driver_class() -> type[Driver] | None:
    """The prompt-escape driver where Textual's Linux driver would run, else None (Textual chooses)."""
    if os.name == "nt" or os.environ.get("TEXTUAL_DRIVER"):
        return None
    try:
        from textual import constants
        from textual._loop import loop_last
        from textual._parser import ParseError
        from textual._time import get_time
        from textual._xterm_parser import XTermParser
        from textual.drivers.linux_driver import LinuxDriver
    except ImportError:  # pragma: no cover - a Textual release that moved these
        return None
    if "ESCDELAY" not in os.environ:
        setattr(constants, "ESCAPE_DELAY", ESCAPE_DELAY)  # noqa: B010 - Final there; read at each ESC

    class PromptEscapeDriver(LinuxDriver):
        def run_input_thread(self) -> None:
            selector = selectors.SelectSelector()
            selector.register(self.fileno, selectors.EVENT_READ)
            parser = XTermParser(self._debug)
            decode = getincrementaldecoder("utf-8")().decode

            def process(events: list[tuple[selectors.SelectorKey, int]], final: bool = False) -> None:
                for last, (_key, mask) in loop_last(events):
                    if mask & selectors.EVENT_READ:
                        data = decode(os.read(self.fileno, 1024 * 4), final=final and last)
                        if not data:
                            break
                        for event in parser.feed(data):
                            self.process_message(event)
                for event in parser.tick():
                    self.process_message(event)

            try:
                while not self.exit_event.is_set():
                    process(selector.select(_wake_in(parser, get_time())))
                selector.unregister(self.fileno)
                process(selector.select(IDLE_WAKE), final=True)
            finally:
                selector.close()
                try:
                    for _event in parser.feed(""):
                        pass
                except (EOFError, ParseError):
                    pass

    return PromptEscapeDriver
