"""The rank files of a tag folder: sorted by role and rank, checked to stay inside the checkpoint, loaded.

A file that cannot be read becomes an error finding naming it; only the rank-0 model states are essential.
"""

from __future__ import annotations

import contextlib
import gc
import os
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, TypeVar

from inspector.errors import InspectorError, NotACheckpointError, StoreError, UnsupportedCheckpointError
from inspector.format.container import Container
from inspector.format.torchzip import TensorRef, load
from inspector.parse.layers import TensorFile
from inspector.scan.locate import EXPERT_RE, EXPP_RE, LAYER_RE, MODEL_RE, OPTIM_RE, ZERO3_MODEL_RE
from inspector.scan.model import Finding, Severity
from inspector.system.bytesource import ByteSource

T = TypeVar("T")


@dataclass
class RankFiles:
    """A tag folder's rank files by role and DP rank (model-parallel rank 0 only)."""

    optim: dict[int, str] = field(default_factory=dict)
    zero3_model: dict[int, str] = field(default_factory=dict)
    experts: dict[tuple[int, int], str] = field(default_factory=dict)  # (MoE layer, global expert) -> file
    model: str | None = None
    findings: list[Finding] = field(default_factory=list)
    present: int = 0  # files in the tag folder: rank numbers cannot exceed it
    names: tuple[str, ...] = ()  # every name in the tag folder, for the claim pass (scan/claims.py)
    opened: dict[str, tuple[int, int]] = field(default_factory=dict)  # loaded: (size, mtime_ns) at open


def classify(tag_dir: str, source: ByteSource, *, experts_ok: bool = False) -> RankFiles:
    """Sort a tag folder's files by role and DP rank; reject layouts we do not read yet.

    Rank numbers come from file names, so they are bounded by the files present: a stray
    `..._rank_1000000000_...` must not make the scan expect (and report) a billion missing ranks."""
    names = source.listdir(tag_dir)
    files = RankFiles(present=len(names), names=tuple(names))
    mp_ranks: set[int] = set()
    layers = [n for n in names if LAYER_RE.match(n)]
    experts = [n for n in names if EXPERT_RE.match(n) or EXPP_RE.match(n)]
    if layers:
        raise UnsupportedCheckpointError(
            f"{tag_dir} is a pipeline-parallel checkpoint ({len(layers)} layer_*-model_states.pt files).",
            hint="Pipeline-parallel (PipelineModule) checkpoints are not supported yet.",
        )
    layered = all((m := EXPERT_RE.match(n)) and m.group(2) is not None for n in experts)
    if experts and experts_ok and layered:
        for n in experts:
            m = EXPERT_RE.match(n)
            if m and m.group(2) is not None and int(m.group(4)) == 0:
                files.experts[(int(m.group(2)), int(m.group(3)))] = os.path.join(tag_dir, n)
    elif experts:
        raise UnsupportedCheckpointError(
            f"{tag_dir} is a native MoE checkpoint ({len(experts)} expert files such as {experts[0]}).",
            hint="Native MoE is read under ZeRO-1/2 with layer_L_expert_E files; runs without ZeRO "
            "(expp_rank_* optimizer files) and pre-0.6 expert file names are not supported yet.",
        )
    for n in names:
        path = os.path.join(tag_dir, n)
        if m := OPTIM_RE.match(n):
            dp, mp = int(m.group(2)), int(m.group(3))
            mp_ranks.add(mp)
            if mp == 0:
                files.optim[dp] = path  # two spellings of one rank: the claim pass (claims.py) names both
        elif m := ZERO3_MODEL_RE.match(n):
            mp_ranks.add(int(m.group(2)))
            if int(m.group(2)) == 0:
                files.zero3_model[int(m.group(1))] = path
        elif m := MODEL_RE.match(n):
            mp_ranks.add(int(m.group(1)))
            if int(m.group(1)) == 0:
                files.model = path
    _bound_ranks(tag_dir, files, len(names))
    if len(mp_ranks) > 1:
        raise UnsupportedCheckpointError(
            f"{tag_dir} has {len(mp_ranks)} model-parallel ranks (mp_rank_00..{max(mp_ranks):02d}).",
            hint="Tensor/model-parallel checkpoints hold shards that need model-specific merge rules; "
            "not supported yet.",
        )
    return files


def _bound_ranks(tag_dir: str, files: RankFiles, present: int) -> None:
    """A DP rank can be no larger than the number of files in the folder: rank r means r+1 rank files."""
    for role in (files.optim, files.zero3_model):
        high = [r for r in role if r >= present]
        if high:
            raise NotACheckpointError(
                f"{tag_dir} holds a rank file numbered {max(high):,} but only {present} files in all: "
                "a stray or crafted file, since every rank of a run writes its own file.",
                hint="Remove the stray file (or restore the missing rank files) and try again.",
                title="Impossible rank number",
            )


def missing_ranks(found: dict[int, str], expected: int, what: str, tag_dir: str) -> list[Finding]:
    """One finding per missing rank, or one for them all when many are missing (bounded output)."""
    missing = [r for r in range(expected) if r not in found]
    hint = "Copy the complete checkpoint folder; every rank writes its own file."
    if len(missing) > 8:
        return [
            Finding(
                Severity.ERROR,
                "missing-rank",
                f"{len(missing):,} {what} files are missing (DP ranks {missing[0]}..{missing[-1]}).",
                tag_dir,
                hint,
            )
        ]
    return [
        Finding(Severity.ERROR, "missing-rank", f"The {what} file for DP rank {r} is missing.", tag_dir, hint)
        for r in missing
    ]


def load_all(
    paths: list[tuple[int, str]],
    source: ByteSource,
    findings: list[Finding],
    parse: Callable[[Any, str], T],
    read: Callable[[T, Container], None] | None = None,
    skip: frozenset[str] = frozenset(),
    opened: dict[str, tuple[int, int]] | None = None,
) -> dict[int, T | None]:
    """`load_or_finding` for every (rank, path), findings in rank order. From an object store the files are
    loaded several at once: each costs a few round trips (directory, header, pickle), and a 128-rank folder
    read one file after another would spend minutes waiting. The cyclic collector waits meanwhile
    (`_collector_paused`). `opened` (`RankFiles.opened`): each local file's size and save time, from the
    fstat done at its open, so its `FileInfo` needs no stat of its own."""
    keeping = getattr(source, "keeping", contextlib.nullcontext)  # a local folder: one openat a file
    with _collector_paused(), keeping():
        return _load_all(paths, source, findings, parse, read, skip, opened)


@contextlib.contextmanager
def _collector_paused() -> Iterator[None]:
    """The cyclic garbage collector off while rank files load, back as it was after (what was cyclic is
    collected then). The records they make hold no cycles, and each collection of the oldest generation
    walks every record kept so far: at 4,096 ranks three of them cost 0.35 of the scan's 2.1 CPU-seconds,
    a cost that grows with the square of the rank count."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def _load_all(
    paths: list[tuple[int, str]],
    source: ByteSource,
    findings: list[Finding],
    parse: Callable[[Any, str], T],
    read: Callable[[T, Container], None] | None,
    skip: frozenset[str],
    opened: dict[str, tuple[int, int]] | None = None,
) -> dict[int, T | None]:
    if len(paths) < 2 or not source.remote:
        return {r: load_or_finding(p, source, findings, parse, read, skip, opened) for r, p in paths}
    from inspector.remote.backend import inflight

    def one(item: tuple[int, str]) -> tuple[T | None, list[Finding]]:
        own: list[Finding] = []
        return load_or_finding(item[1], source, own, parse, read, skip), own

    with ThreadPoolExecutor(min(inflight(), len(paths)), thread_name_prefix="zi-scan") as pool:
        done = list(pool.map(one, paths))
    for _, own in done:
        findings += own
    return {r: value for (r, _), (value, _) in zip(paths, done, strict=True)}


def load_or_finding(
    path: str,
    source: ByteSource,
    findings: list[Finding],
    parse: Callable[[Any, str], T],
    read: Callable[[T, Container], None] | None = None,
    skip: frozenset[str] = frozenset(),
    opened: dict[str, tuple[int, int]] | None = None,
) -> T | None:
    """Load and parse one rank file through the checkpoint's confined source; a file that cannot be read or
    parsed becomes an error finding naming it (only the rank-0 model states are essential). `read`: a few
    bytes more taken while the file is open (a step counter), so no later check opens it again; it reads
    through the open archive, which serves them from the pages it read already where they lie there.
    `skip`: the root's keys `parse` does not read (`torchzip.load`)."""
    try:
        tree, archive = load(path, source, skip=skip)
        if opened is not None and (mtime := getattr(archive.handle, "mtime_ns", 0)):  # a local file's fstat
            opened[path] = (archive.handle.size, mtime)
        try:
            value = parse(tree, path)
            if read is not None:
                read(value, archive)
            return value
        finally:
            archive.close()
    except StoreError:
        raise  # the store refused (credentials, throttling): not a finding about the file
    except InspectorError as exc:
        findings.append(Finding(Severity.ERROR, "unreadable", exc.message, path, exc.hint))
        return None


def expert_copies(files: RankFiles, source: ByteSource, findings: list[Finding]) -> dict[str, TensorRef]:
    """The 16-bit slices of every per-expert file (`layer_L_expert_E`), by the name each file gives them (an
    unreadable file: a finding); native MoE and AutoEP at ZeRO-1/2 both write them."""
    out: dict[str, TensorRef] = {}
    for _, path in sorted(files.experts.items()):
        tf = load_or_finding(path, source, findings, TensorFile.parse)
        if tf is not None:
            out.update(tf.tensors)
    return out
