"""Small values read from checkpoint metadata: step counters (0-d tensors read with pread), bounded digests
for comparing metadata across rank files, and the stage-3 proof of which rank wrote the last rank file.
"""

from __future__ import annotations

import hashlib
import json
import math
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from inspector.errors import CorruptFileError, InspectorError
from inspector.format.dtypes import STRUCT_FORMATS
from inspector.format.torchzip import TensorRef
from inspector.parse.states import OptimStates
from inspector.scan.model import Finding, Severity
from inspector.system.bytesource import ByteSource, open_handle_in


class Reader(Protocol):
    """What the small reads here need of an open file: a `Handle`, or the open archive (`Container`), whose
    reads are served from the pages it already holds."""

    def pread(self, n: int, offset: int) -> bytes: ...


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


def _read_scalar(ref: TensorRef, handle: Reader | None = None) -> float | int | None:
    """A 0-d tensor's value: through `handle` (its file, already open), or its file opened for it."""
    fmt = "<f" if ref.dtype == "bfloat16" else STRUCT_FORMATS.get(ref.dtype)
    if fmt is None:
        return None
    ((offset, _count),) = ref.runs()
    if handle is not None:
        raw = handle.pread(ref.itemsize, offset)
    else:
        from inspector.remote.roots import open_file  # lazily: a local scan loads no store code

        own = open_file(ref.path)
        try:
            raw = own.pread(ref.itemsize, offset)
        finally:
            own.close()
    if len(raw) != ref.itemsize:
        raise CorruptFileError(
            f"{ref.path}: the file ends inside a tensor at byte {offset}; it is truncated."
        )
    value: float | int = struct.unpack(fmt, b"\0\0" + raw if ref.dtype == "bfloat16" else raw)[0]
    return value


def file_size(path: str | None) -> int:
    try:
        from inspector.remote.roots import parent_source  # lazily: a local scan loads no store code

        return parent_source(path).size_and_mtime(path)[0] if path else 0
    except (OSError, InspectorError):
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


def config_key(config: Mapping[str, Any]) -> str:
    """A DeepSpeed config as compared across rank files: the typed record's plain JSON (`Node.json`: str keys,
    lists, finite numbers, bounded in size and depth), so `json.dumps` tells apart exactly what `digest`
    does (1, 1.0 and true; key order) in C, not in a Python walk per rank file."""
    try:
        return json.dumps(dict(config), allow_nan=False)
    except (TypeError, ValueError, RecursionError):
        return digest(dict(config))


def step_value(step: int | float | TensorRef | None) -> int | float | None:
    """A step as compared across rank files: 0-d tensors read (a few bytes), numbers as they are."""
    return item(step) if isinstance(step, TensorRef) else step


def steps_key(steps: Sequence[int | float | TensorRef | None], handle: Reader | None = None) -> str:
    """A rank file's step counters as compared across rank files; 0-d tensors read through `handle` (the
    file, while it is open for its pickle) when given."""
    return digest([_step_in(s, handle) for s in steps])


def read_steps(steps: Sequence[int | float | TensorRef | None], handle: Reader) -> tuple[str, int | None]:
    """`steps_key` and the first step's `step_item` together, each 0-d tensor read once through `handle`."""
    values = [_step_in(s, handle) for s in steps]
    return digest(values), (item(values[0]) if values else None)


def step_item(step: int | float | TensorRef | None, handle: Reader) -> int | None:
    """`item(step)`, a 0-d tensor read through `handle` (its file, while open for its pickle)."""
    return item(_read_scalar(step, handle)) if isinstance(step, TensorRef) and step.numel == 1 else item(step)


def _step_in(step: int | float | TensorRef | None, handle: Reader | None) -> int | float | None:
    if handle is None or not isinstance(step, TensorRef) or step.numel != 1:
        return step_value(step)
    return item(_read_scalar(step, handle))


_PROOF_ELEMS = 4096  # padding elements read at most for the stage-3 rank proof: a few pages, bounded


_COPY_PROBE = 4096  # bytes of each rank's first moment compared to catch one rank file copied over another


_NO_PROBE = b"?"  # a rank whose probe could not be read: the check proves nothing and says nothing


def rank_probe(st: OptimStates, handle: Reader | None = None, source: ByteSource | None = None) -> bytes:
    """A digest of the first few KiB of a rank's `exp_avg_sq` (or masters) of group 0, through `handle` (the
    file, while it is open for its pickle) or the file opened through `source`: b"" when they are all zero (a
    save before the first step proves nothing), `_NO_PROBE` when there is nothing to read."""
    if not st.groups:
        return _NO_PROBE
    g0 = st.groups[0]
    ref = (g0.moments or {}).get("exp_avg_sq") or g0.master
    n = min(ref.nbytes, _COPY_PROBE)
    if n == 0:
        return _NO_PROBE
    try:
        if handle is not None:
            raw = handle.pread(n, ref.offset)
        else:
            own = open_handle_in(st.file, (source,) if source else ())
            try:
                raw = own.pread(n, ref.offset)
            finally:
                own.close()
    except (OSError, CorruptFileError):
        return _NO_PROBE
    return hashlib.blake2b(raw, digest_size=16).digest() if raw.strip(b"\0") else b""


def copied_ranks(
    states: Sequence[OptimStates], source: ByteSource, probes: Mapping[str, bytes] | None = None
) -> list[Finding]:
    """Two rank files holding the same bytes where every rank holds its own slice of the model: one was copied
    over the other. Compares each rank's `rank_probe`, taken while its file was open for the scan (`probes`,
    by file) or read now; all-zero content is skipped, and a rank with nothing to compare ends the check."""
    seen: dict[bytes, int] = {}
    for r, st in enumerate(states):
        probe = (probes or {}).get(st.file)
        if probe is None:
            probe = rank_probe(st, source=source)
        if probe == _NO_PROBE:
            return []
        if not probe:
            continue
        if probe in seen:
            return [
                Finding(
                    Severity.ERROR,
                    "rank-mismatch",
                    f"The optimizer files of DP ranks {seen[probe]} and {r} hold the same state, though every "
                    "rank saves its own slice: one was copied over the other, so the rebuilt values would be "
                    "wrong.",
                    st.file,
                    "Restore every *_optim_states.pt from the save that wrote it; rank files cannot stand in "
                    "for each other.",
                )
            ]
        seen[probe] = r
    return []


Spots = list[tuple[TensorRef, int, int]]  # (exp_avg_sq of a group, first padding element, count)


def padding_spots(param_shapes: Sequence[Sequence[tuple[str, tuple[int, ...]]]], last: OptimStates, ws: int) -> Spots | None:
    """Where stage 3 leaves zero padding in the last rank's `exp_avg_sq`, at most `_PROOF_ELEMS` elements in
    all, group by group; None when the file cannot say (no moments, fewer groups)."""
    if ws < 2 or any(g.moments is None for g in last.groups):
        return None
    spots: Spots = []
    budget = _PROOF_ELEMS
    for g, shapes in enumerate(param_shapes):
        if g >= len(last.groups):
            return None
        sq = (last.groups[g].moments or {})["exp_avg_sq"]
        off = 0
        for _, shape in shapes:
            n = math.prod(shape)
            p = -(-n // ws)
            take = max(0, min(p, n - (ws - 1) * p))
            if p > take and budget > 0:
                k = min(p - take, budget)
                spots.append((sq, off + take, k))
                budget -= k
            off += p
    return spots


def read_padding(spots: Spots, reader: Reader) -> tuple[int, int] | None:
    """(non-zero elements, elements) at `spots`, read through `reader` (the last rank's file, while it is
    open for its pickle); None when they cannot be read (a record too short, a dtype without a format)."""
    nonzero = total = 0
    try:
        for ref, start, count in spots:
            if start + count > ref.numel:
                return None
            raw = reader.pread(count * ref.itemsize, ref.offset + start * ref.itemsize)
            fmt = STRUCT_FORMATS.get(ref.dtype)
            if fmt is None or len(raw) != count * ref.itemsize:
                return None
            values = struct.unpack(f"<{count}{fmt[-1]}", raw)
            total += count
            nonzero += sum(1 for v in values if v != 0)
    except (OSError, CorruptFileError):
        return None
    return nonzero, total


@dataclass(frozen=True)
class PaddingRead:
    """The proof's padding as read while the last rank's file was open: for which parameter shapes, and what
    `read_padding` found there (None: nothing to prove)."""

    file: str
    param_shapes: Sequence[Sequence[tuple[str, tuple[int, ...]]]]
    found: tuple[int, int] | None


def stage3_rank_proof(
    param_shapes: Sequence[Sequence[tuple[str, tuple[int, ...]]]],
    states: Sequence[OptimStates],
    source: ByteSource,
    taken: PaddingRead | None = None,
) -> list[Finding]:
    """Which rank wrote the last stage-3 optimizer file, from the one thing that tells ranks apart.

    Stage 3 pads each parameter's last slice out to ceil(numel/ws) elements, on the last rank only; the
    padding gets zero gradients, so its Adam moments stay exactly 0 (the masters there are uninitialised,
    §3.4). Another rank's file in the last rank's place holds real moments at those positions. Reads at most
    a few KiB, and none when `taken` holds them for these shapes (read as the scan loaded the file); nothing
    else in scan reads tensor data."""
    ws = len(states)
    last = states[-1]
    if taken is not None and taken.file == last.file and taken.param_shapes == param_shapes:
        found = taken.found
    else:
        spots = padding_spots(param_shapes, last, ws)
        if not spots:
            return []
        handle = open_handle_in(last.file, (source,))
        try:
            found = read_padding(spots, handle)
        finally:
            handle.close()
    if found is None or found[0] < found[1] or not found[1]:
        return []
    nonzero, total = found
    return [
        Finding(
            Severity.ERROR,
            "rank-mismatch",
            f"The last rank's optimizer file holds Adam moments where DeepSpeed leaves zero padding "
            f"({nonzero} of {total} padding elements non-zero): it was not written by rank {ws - 1} "
            "(a rank file copied or renamed into its place), so the rebuilt values would be wrong.",
            last.file,
            "Restore every *_optim_states.pt from the save that wrote it; rank files cannot stand in for each other.",
        )
    ]
