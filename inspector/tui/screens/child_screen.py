"""The convert screen's child process: started with its JSON-lines events turned into messages, its memory
sampled, held while a question about it is open, and stopped when the screen goes. Apart from the screen, which
decides what each event and exit means."""

from __future__ import annotations

from typing import Any

import psutil
from textual.screen import Screen

from inspector.convert.events import from_doc
from inspector.tui.child import Child
from inspector.tui.messages import ChildEvent, ChildExited
from inspector.tui.typed import zi
from inspector.tui.widgets.meter import MemoryMeter
from inspector.tui.widgets.progress import ConvertProgress


class ChildScreen(Screen[None]):
    """A screen that runs one child at a time (`job` names it in its messages) and shows it in its
    `ConvertProgress` and `MemoryMeter`."""

    def __init__(self) -> None:
        super().__init__()
        self.child: Child | None = None
        self.job = "convert"

    def _fail(self, title: str, message: str, hint: str = "") -> None:
        """What the screen says when its child cannot run; the screen decides how it shows it."""
        raise NotImplementedError

    def _spawn(self, args: list[str], stdin: str | None = None) -> None:
        job = self.job

        def on_event(doc: dict[str, Any]) -> None:
            ev = from_doc(doc)
            if ev is not None:  # a line that is not one of our events (a library's warning) is dropped
                self.post_message(ChildEvent(job, ev))

        def on_exit(rc: int, err: str) -> None:
            self.post_message(ChildExited(job, rc, err))

        self.child = Child(args, on_event, on_exit, stdin)
        try:
            self.child.start()
        except OSError as exc:
            self._fail("Cannot start the converter", str(exc))

    def _sample(self) -> None:
        if self.child is not None and self.child.running:
            self.query_one(MemoryMeter).add_sample(self.child.rss(), psutil.virtual_memory().available)

    # --- holding and stopping ---------------------------------------------------------------------------

    @property
    def on_ray(self) -> bool:
        return zi(self).export.executor == "ray"

    def held_words(self) -> str:
        """What a question holds while it is open: the child here; Ray's tasks run on (only their driver waits)."""
        if self.on_ray:
            return "The Ray tasks go on writing while you decide; only their driver here waits."
        return "It is paused while you decide."

    def pause_child(self) -> None:
        """Hold the converter while a question about it is open (a dialog must not race the job)."""
        if self.child is not None and self.child.running:
            self.child.pause()
            self.query_one(ConvertProgress).say(
                "Waiting while you decide (the Ray tasks go on)…"
                if self.on_ray
                else "Paused while you decide…"
            )

    def resume_child(self) -> None:
        if self.child is not None and self.child.running:
            self.child.resume()

    def _escalate(self) -> None:
        if self.child is not None and self.child.running:
            self.child.terminate()

    def stop_child(self) -> None:
        if self.child is not None and self.child.running:
            self.child.interrupt()
            self.child.resume()  # a held child takes the interrupt once it runs again
            try:
                assert self.child.proc is not None
                self.child.proc.wait(10)
            except Exception:
                self.child.kill()
