"""The JSON-lines events a `convert` / `verify` child prints for a front end (`--progress json`), as types the
writer (cli/progress.py) and the reader (the app) share: one object per line, `{"event": NAME, ...fields}`.

The reader checks every field's type before it builds an event, so a line that is not ours (a library's
warning on stdout, a cut line) is dropped instead of reaching a widget as a half-filled dict.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from typing import Any, ClassVar

from inspector.text import shown_doc


@dataclass(frozen=True)
class Started:
    """A conversion passed its checks and starts: what it will write."""

    NAME: ClassVar[str] = "start"
    out_dir: str
    kind: str
    tensors: int
    output_bytes: int
    files: list[list[Any]] = field(default_factory=list)  # [name, planned bytes]
    uses_selection: bool = True
    keeps_on_cancel: bool = False
    predicted_peak_rss: int = 0
    plan: str = ""  # the job's identity as the child planned it: the app refuses to go on if it is not its own


@dataclass(frozen=True)
class Progressed:
    """Bytes done of the total (at most ~4 a second); the file in hand and its own bytes when writing."""

    NAME: ClassVar[str] = "progress"
    bytes_done: int
    bytes_total: int
    tensor: str = ""
    elapsed: float = 0.0
    throughput: float = 0.0
    file: str = ""  # empty while verifying
    file_index: int = 0
    files: int = 1
    files_done: int = 0  # of the files the plan lists (`Started.files`), finished: it never goes back
    file_done: int = 0
    file_total: int = 0


@dataclass(frozen=True)
class Finished:
    """A conversion's report: every file written with its size."""

    NAME: ClassVar[str] = "report"
    out_dir: str
    files: list[list[Any]]  # [name, bytes]
    tensors: int
    bytes_written: int
    seconds: float
    resumed_files: int = 0
    removed_stale: list[str] = field(default_factory=list)
    peak_rss: int = 0
    words: str = ""


@dataclass(frozen=True)
class Verified:
    """A verify's result."""

    NAME: ClassVar[str] = "verified"
    ok: bool
    checked: int
    bytes_checked: int
    mismatched: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    unexpected: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    seconds: float = 0.0


@dataclass(frozen=True)
class Failed:
    """A user error, as the CLI would print it (the exit code follows)."""

    NAME: ClassVar[str] = "error"
    title: str
    message: str
    hint: str = ""
    exit_code: int = 1


@dataclass(frozen=True)
class Cancelled:
    NAME: ClassVar[str] = "cancelled"


Event = Started | Progressed | Finished | Verified | Failed | Cancelled
_BY_NAME: dict[str, type[Any]] = {
    c.NAME: c for c in (Started, Progressed, Finished, Verified, Failed, Cancelled)
}


def _fits(annotation: str, value: object) -> bool:
    """Whether a JSON value has the field's type (a bool is not a count; an int is a float)."""
    kind = annotation.split("[")[0]
    if kind == "list":
        return isinstance(value, list)
    if kind == "bool" or isinstance(value, bool):
        return kind == "bool" and isinstance(value, bool)
    expected = {"str": (str,), "int": (int,), "float": (int, float)}.get(kind)
    return expected is None or isinstance(value, expected)


def to_line(event: Event) -> str:
    """The event's line, every string in it `shown` (secrets redacted, controls escaped): the reader shows
    names, paths and messages as they come."""
    return json.dumps(shown_doc({"event": event.NAME, **asdict(event)}))


def from_doc(doc: object) -> Event | None:
    """The event a parsed JSON line describes, or None when it is not one of ours (unknown name, a field of
    the wrong type, a required field missing)."""
    if not isinstance(doc, dict):
        return None
    cls = _BY_NAME.get(str(doc.get("event")))
    if cls is None:
        return None
    values = {}
    for f in fields(cls):
        if f.name not in doc:
            continue
        value = doc[f.name]
        if not _fits(str(f.type), value):
            return None
        values[f.name] = value
    try:
        event: Event = cls(**values)
    except TypeError:  # a required field missing
        return None
    return event
