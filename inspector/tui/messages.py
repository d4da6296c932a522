"""Messages posted by worker threads and the conversion child; the UI updates only in their handlers."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from textual.message import Message

from inspector.convert.events import Event, Progressed
from inspector.convert.selections import Selection
from inspector.errors import InspectorError
from inspector.scan.layouts import Found
from inspector.scan.model import Checkpoint

if TYPE_CHECKING:
    from inspector.convert.kinds import Job
    from inspector.convert.preflight import Assessment


@dataclass
class Located(Message):
    """The tag is known (locate is fast); the scan of its files follows."""

    location: Found
    opened: bool = True  # False: the asked-for tag is missing; these are the root's tags, none opened
    request: int = 0  # which scan request it answers


@dataclass
class Scanned(Message):
    checkpoint: Checkpoint
    seconds: float
    request: int = 0
    offered: tuple[Selection, ...] = ()  # the selections its layout proposes (convert/selections.proposed)
    state_problem: str = ""  # why the saved selections could not be read (shown once), "" when they could


@dataclass
class ScanFailed(Message):
    error: InspectorError
    request: int = 0


@dataclass
class DemoWritten(Message):
    path: str


@dataclass
class ChildEvent(Message):
    """One JSON-lines event from a `convert`/`verify` child (progress, start, report, error)."""

    job: str  # "convert" | "verify"
    event: Event

    def can_replace(self, message: Message) -> bool:
        """A burst of progress lines collapses into the newest."""
        return (
            isinstance(message, ChildEvent)
            and message.job == self.job
            and isinstance(message.event, Progressed)
            and isinstance(self.event, Progressed)
        )


@dataclass
class ChildExited(Message):
    job: str
    returncode: int
    stderr: str


@dataclass
class MemorySample(Message):
    """The child's RSS and the machine's available memory, sampled off the UI thread."""

    rss: int
    available: int

    def can_replace(self, message: Message) -> bool:
        return isinstance(message, MemorySample)


@dataclass
class Preflighted(Message):
    """The convert screen's preflight worker finished (a plan and its assessment, or the error)."""

    plan: Job | None
    assessment: Assessment | None
    error: InspectorError | None = None
