"""Tied weights in a DCP folder: the saver writes a tied parameter under each of its names (`head.weight`
beside `emb.weight`), while the optimizer holds one entry. The name without optimizer state is shown as a
TIED alias of the one with it when their bytes are equal, not as a frozen parameter of its own."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from dataclasses import replace

from inspector.format.zstditem import open_item, parse_item_path
from inspector.scan.model import Finding, Kind, Segment, Severity, TensorInfo
from inspector.system.bytesource import ByteSource, Handle
from inspector.text import shown

COMPARE_LIMIT = 256 << 20  # bytes of one tensor read at scan to prove a tie; past it the tie is only named
_PIECE = 1 << 20


def tie(source: ByteSource, tensors: list[TensorInfo], folder: str) -> tuple[list[TensorInfo], list[Finding]]:
    """`tensors` with each frozen one that equals a trainable one of its shape and dtype made its alias."""
    owners: dict[tuple[tuple[int, ...], str], list[TensorInfo]] = {}
    for t in tensors:
        if t.kind is Kind.TRAINABLE:
            owners.setdefault((t.shape, t.dtype), []).append(t)
    out, findings, digests = [], [], _Digests(source)
    for t in tensors:
        same = owners.get((t.shape, t.dtype), []) if t.kind is Kind.FROZEN and t.numel else []
        if same and t.nbytes > COMPARE_LIMIT:
            findings.append(_uncompared(t, same, folder))
        elif owner := next((o for o in same if digests.of(o) == digests.of(t)), None):
            t = replace(
                t, kind=Kind.TIED, alias_of=owner.name, segments=owner.segments, moments=owner.moments
            )
        out.append(t)
    digests.close()
    return out, findings


def _uncompared(t: TensorInfo, same: Sequence[TensorInfo], folder: str) -> Finding:
    return Finding(
        Severity.INFO,
        "dcp-tied-unchecked",
        f"{shown(t.name)} has no optimizer state and the shape of {shown(same[0].name)}: probably tied to it; "
        f"not compared ({t.nbytes:,} bytes, above the {COMPARE_LIMIT >> 20} MiB read at scan), so both are "
        "kept.",
        folder,
    )


class _Digests:
    """Each tensor's bytes hashed once, read piece by piece through the checkpoint's source."""

    def __init__(self, source: ByteSource) -> None:
        self.source = source
        self.handles: dict[str, Handle] = {}
        self.done: dict[str, bytes] = {}

    def of(self, t: TensorInfo) -> bytes:
        if t.name not in self.done:
            self.done[t.name] = self._hash(t.segments)
        return self.done[t.name]

    def _hash(self, segments: Iterable[Segment]) -> bytes:
        h = hashlib.blake2b(digest_size=32)
        for seg in segments:
            handle = self._handle(seg.file)
            for at in range(0, seg.nbytes, _PIECE):
                n = min(_PIECE, seg.nbytes - at)
                data = handle.pread(n, seg.offset + at)
                h.update(data)
                if len(data) < n:  # a short file: its own digest, equal to nothing complete
                    return b"short:" + h.digest()
        return h.digest()

    def _handle(self, path: str) -> Handle:
        if path not in self.handles:
            item = parse_item_path(path)  # a compressed item: over its file's one handle
            self.handles[path] = (
                open_item(path, (self.source,), self._handle(item[0]))
                if item
                else self.source.open_handle(path)
            )
        return self.handles[path]

    def close(self) -> None:
        for handle in self.handles.values():
            handle.close()
