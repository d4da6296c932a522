"""Small values read from checkpoint metadata: step counters (0-d tensors read with pread), bounded digests
for comparing metadata across rank files, the optimizer's per-group steps.
"""

from __future__ import annotations

import math
import os
import struct
from collections.abc import Mapping
from typing import Any

from inspector.errors import CorruptFileError
from inspector.format.dtypes import STRUCT_FORMATS
from inspector.format.torchzip import TensorRef
from inspector.format.zipreader import os_error
from inspector.system.source import open_in


def dtype_of(tensors: Mapping[str, Any]) -> str | None:
    for v in tensors.values():
        if isinstance(v, TensorRef) and v.dtype in ("bfloat16", "float16", "float32"):
            return v.dtype
    return None


def item(value: Any) -> int | None:
    """A step counter: int, float or a 0-d TensorRef (read its few bytes with pread; no torch import)."""
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, TensorRef) and value.numel == 1:
        value = _read_scalar(value)
    if isinstance(value, int):
        return value
    if isinstance(value, float) and math.isfinite(value):
        return int(value)
    return None


def _read_scalar(ref: TensorRef) -> float | int | None:
    fmt = "<f" if ref.dtype == "bfloat16" else STRUCT_FORMATS.get(ref.dtype)
    if fmt is None:
        return None
    ((offset, _count),) = ref.runs()
    fd = open_in(ref.path)
    try:
        raw = os.pread(fd, ref.itemsize, offset)
    except OSError as exc:
        raise os_error(ref.path, exc) from None
    finally:
        os.close(fd)
    if len(raw) != ref.itemsize:
        raise CorruptFileError(
            f"{ref.path}: the file ends inside a tensor at byte {offset}; it is truncated."
        )
    value: float | int = struct.unpack(fmt, b"\0\0" + raw if ref.dtype == "bfloat16" else raw)[0]
    return value


def file_size(path: str | None) -> int:
    try:
        return os.path.getsize(path) if path else 0
    except OSError:
        return 0


class _TooBig(Exception):
    pass


def digest(value: Any, max_nodes: int = 100_000, max_depth: int = 64) -> str:
    """A comparable text form of metadata (config, steps, shapes), like repr() but bounded: a crafted pickle
    can nest 100k levels deep (repr -> RecursionError) or share sub-trees so repr's output is exponential."""
    out: list[str] = []
    budget = [max_nodes]

    def walk(v: Any, depth: int) -> None:
        budget[0] -= 1
        if budget[0] < 0 or depth > max_depth:
            raise _TooBig
        if isinstance(v, dict):
            out.append("{")
            for k, x in v.items():
                walk(k, depth + 1)
                out.append(":")
                walk(x, depth + 1)
                out.append(",")
            out.append("}")
        elif isinstance(v, list | tuple | set | frozenset):
            out.append(type(v).__name__ + "(")
            for x in v:
                walk(x, depth + 1)
                out.append(",")
            out.append(")")
        elif v is None or isinstance(v, str | bytes | int | float | complex):
            out.append(repr(v))
        elif isinstance(v, TensorRef):
            out.append(f"tensor({v.dtype},{v.shape})")
        else:
            out.append(type(v).__qualname__)
            walk(getattr(v, "__dict__", {}), depth + 1)

    try:
        walk(value, 0)
    except _TooBig:
        return f"<too large or deep to compare: {type(value).__name__}>"
    return "".join(out)


def _base_state(osd: dict[str, Any]) -> Any:
    return osd.get("base_optimizer_state", osd.get("optimizer_state_dict"))


def group_steps(osd: dict[str, Any]) -> list[Any]:
    base = _base_state(osd)
    state = base.get("state") if isinstance(base, dict) else None
    if not isinstance(state, dict):
        return []
    out = []
    for s in state.values():
        step = s.get("step") if isinstance(s, dict) else None
        out.append(item(step) if isinstance(step, TensorRef) else step)
    return out


def first_step(osd: dict[str, Any] | None) -> Any:
    steps = group_steps(osd) if osd else []
    return steps[0] if steps else None
