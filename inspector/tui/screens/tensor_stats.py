"""The Tensors tab's statistics job: stream one tensor's values (and its module copy, and the same tensor at the
previous tag) and post what is found as `StatsUpdate` messages. Runs in the pane's worker thread; it never
touches a widget, so the pane applies every update on the UI thread."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from rich.console import RenderableType
from rich.text import Text
from textual.message import Message

from inspector.errors import CancelledError, InspectorError
from inspector.health.tensor import Difference, StatsProgress, TensorStats
from inspector.scan.model import Checkpoint, TensorInfo
from inspector.tui.widgets.tensor_detail import difference_line, stats_renderable

if TYPE_CHECKING:
    from inspector.convert.reader import FilePool


@dataclass
class StatsUpdate(Message):
    """From the statistics worker: progress, a result, or an error, for one tensor."""

    name: str
    progress: StatsProgress | None = None
    what: str = ""
    result: RenderableType | None = None
    done: bool = False

    def can_replace(self, message: Message) -> bool:
        return isinstance(message, StatsUpdate) and message.progress is not None and self.progress is not None


Post = Callable[[Message], object]


def stream_stats(
    ckpt: Checkpoint,
    t: TensorInfo,
    cancel: threading.Event,
    post: Post,
    *,
    timed: bool = True,
    tp_split: Sequence[tuple[str, str]] = (),
) -> None:
    """Statistics of `t`, the largest difference of its 16-bit module copy from the master, and how much it
    changed since the neighbouring tag (scanned with `tp_split`, as this one was); `cancel` stops it between
    chunks. Ends with a `done` update unless cancelled. `timed`: say how long the read took (not in a frozen
    app)."""
    from inspector.convert.reader import (  # numpy's reader loads with the first statistics, not at launch
        FilePool,
        open_cap,
    )
    from inspector.health.tensor import difference, tensor_stats

    try:  # beside the Health tab's pass and its pool (half the descriptors): a quarter
        with FilePool(ckpt.source, cap=open_cap(4)) as pool:
            for ev in tensor_stats(t.segments, pool, cancel):
                if isinstance(ev, TensorStats):
                    post(StatsUpdate(t.name, result=stats_renderable(ev, timed)))
                else:
                    post(StatsUpdate(t.name, progress=ev, what="reading values"))
            # the scan's own record of the 16-bit copy, as the health pass reads it: an expert's sits in its
            # expert file, a stage's layer in its layer file, a TP tensor in every shard's model states (the
            # first model-states file's `module`, read here before, had none of them)
            copy = t.module_copy if sum(s.numel for s in t.module_copy) == t.numel else ()
            if copy:
                for d in difference(t.segments, copy, pool, cancel):
                    if isinstance(d, Difference):
                        label = f"{copy[0].dtype} module copy vs master"
                        post(StatsUpdate(t.name, result=difference_line(label, d)))
                    else:
                        post(StatsUpdate(t.name, progress=d, what="comparing with the module copy"))
            other = other_tag(ckpt)
            if other is not None:
                _compare_tag(ckpt, t, other, pool, cancel, post, tp_split)
    except CancelledError:
        return
    except (InspectorError, ValueError, OSError) as exc:
        post(StatsUpdate(t.name, result=Text(f"Cannot read it: {exc}", style="red")))
    post(StatsUpdate(t.name, done=True))


def other_tag(ckpt: Checkpoint) -> str | None:
    """The tag to compare with: the previous one, or the next when this is the oldest."""
    tags = list(ckpt.tags)
    if len(tags) < 2 or ckpt.tag not in tags:
        return None
    i = tags.index(ckpt.tag)
    return tags[i - 1] if i > 0 else tags[i + 1]


def _compare_tag(
    ckpt: Checkpoint,
    t: TensorInfo,
    other: str,
    pool: FilePool,
    cancel: threading.Event,
    post: Post,
    tp_split: Sequence[tuple[str, str]],
) -> None:
    from inspector.health.since import refuse_damaged
    from inspector.health.tensor import difference
    from inspector.scan.scanner import scan

    try:
        scanned = scan(ckpt.root, other, tp_split=tuple(tp_split))
        refuse_damaged(scanned)  # a damaged tag is not compared: the health pass's rule
    except InspectorError as exc:
        post(StatsUpdate(t.name, result=Text(f"{other}: cannot compare: {exc.message}", style="red")))
        return
    try:
        theirs = scanned.tensor(t.name)
    except KeyError:
        post(StatsUpdate(t.name, result=Text(f"{other}: no such tensor to compare", style="dim")))
        return
    if theirs.numel != t.numel:
        post(StatsUpdate(t.name, result=Text(f"{other}: shape differs", style="yellow")))
        return
    for d in difference(theirs.segments, t.segments, pool, cancel):
        if isinstance(d, Difference):
            post(StatsUpdate(t.name, result=difference_line(f"change since {other}", d)))
        else:
            post(StatsUpdate(t.name, progress=d, what=f"comparing with {other}"))
