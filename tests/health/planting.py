"""Plant values into a checkpoint's bytes (tests and the screenshot script): no torch, no inspector writer.

Writes go straight to the rank files a scan located: this is test tooling that damages copies on purpose.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from inspector.format.dtypes import numpy_dtype
from inspector.scan.model import Segment


def plant(segments: Sequence[Segment], index: Sequence[int], values: Sequence[float]) -> None:
    """Overwrite elements `index` (flat, in the tensor) of the tensor stored in `segments` with `values`."""
    for i, v in zip(index, values, strict=True):
        pos = i
        for seg in segments:
            if pos < seg.numel:
                raw = np.array([v], dtype=np.float64).astype(numpy_dtype(seg.dtype)).tobytes()
                with open(seg.file, "r+b") as fh:
                    fh.seek(seg.offset + pos * len(raw))
                    fh.write(raw)
                break
            pos -= seg.numel
        else:
            raise IndexError(i)


def overwrite(segments: Sequence[Segment], values: np.ndarray[Any, Any]) -> None:
    """Write a whole tensor's new values (in the segments' dtype) over its bytes."""
    flat = values.reshape(-1)
    pos = 0
    for seg in segments:
        part = flat[pos : pos + seg.numel].astype(numpy_dtype(seg.dtype))
        with open(seg.file, "r+b") as fh:
            fh.seek(seg.offset)
            fh.write(part.tobytes())
        pos += seg.numel
