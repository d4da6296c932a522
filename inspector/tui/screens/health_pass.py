"""The Health tab's background pass, apart from the pane that shows it: the one message its worker posts,
the worker thread's lowered priority (so keys answer while it reads) and the count of streams it will read,
known before the first one finishes."""

from __future__ import annotations

import contextlib
import os
import threading
from dataclasses import dataclass, field

from textual.message import Message

from inspector.errors import InspectorError
from inspector.health import HealthProgress, HealthReport, Row
from inspector.scan.model import Checkpoint

FLUSH = 0.1  # rows reach the table at most this often: a message per tiny tensor would flood the UI


@dataclass
class HealthUpdate(Message):
    """From the health worker, for one run: finished rows, progress, the report, or how it ended."""

    run: int
    rows: list[Row] = field(default_factory=list)
    progress: HealthProgress | None = None
    report: HealthReport | None = None
    error: InspectorError | None = None
    cancelled: bool = False


NICE = 10


def lower_priority() -> None:
    """Lower this thread's CPU priority (Linux: per thread, inherited by the threads it starts), so the pass's
    reductions yield the cores to the UI thread: keys answer as fast as when idle while it reads."""
    with contextlib.suppress(AttributeError, OSError):  # not Linux, or not allowed: the UI's own priority
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), NICE)


def planned(ckpt: Checkpoint, against: Checkpoint | None) -> HealthProgress:
    """Nothing read yet of every stream the pass will read (`check`'s own plan): "0 of 129 streams" before
    the first one finishes, so the count never grows under the reader's eyes."""
    from inspector.convert.options import ConvertOptions, select
    from inspector.health.stream import plan_jobs

    jobs = plan_jobs(ckpt, select(ckpt, ConvertOptions()), against)
    return HealthProgress(0, sum(j.nbytes for j in jobs), 0, len(jobs))
