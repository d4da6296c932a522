"""The JSON-lines events are one set of types for the writer (the CLI child) and the reader (the app)."""

from __future__ import annotations

import json

import pytest

from inspector.convert.events import (
    Cancelled,
    Failed,
    Finished,
    Progressed,
    Started,
    Verified,
    from_doc,
    to_line,
)

EVENTS = [
    Started("/o", "model", 3, 100, [["model.safetensors", 100]], True, False, 5 << 20),
    Progressed(50, 100, "w", 0.5, 100.0, "model.safetensors", 0, 1, 50, 100),
    Progressed(50, 100, "w", 0.5, 100.0),  # verify: no file
    Finished("/o", [["model.safetensors", 100]], 3, 100, 1.5, 0, [], 40 << 20, ""),
    Verified(True, 3, 100),
    Failed("Output folder not empty", "/o is not empty", "pass --overwrite", 2),
    Cancelled(),
]


@pytest.mark.parametrize("event", EVENTS, ids=lambda e: type(e).__name__)
def test_every_event_round_trips_through_a_line(event: object) -> None:
    assert from_doc(json.loads(to_line(event))) == event  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "doc",
    [
        {"event": "progress", "bytes_done": "50", "bytes_total": 100},  # a field of the wrong type
        {"event": "progress", "bytes_done": True, "bytes_total": 100},  # a bool is not a count
        {"event": "progress", "bytes_total": 100},  # a required field missing
        {"event": "verified", "ok": 1, "checked": 1, "bytes_checked": 1},  # a count is not a yes/no
        {"event": "report", "out_dir": "/o", "files": "x", "tensors": 1, "bytes_written": 1, "seconds": 1},
        {"event": "shell", "cmd": "rm -rf /"},  # not one of ours
        ["progress"],
        "DeepSpeed warning: accelerator not found",
    ],
)
def test_a_line_that_is_not_ours_is_dropped(doc: object) -> None:
    assert from_doc(doc) is None
