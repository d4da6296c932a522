"""The output boundary's names: what a path below OUT may be, which files are bookkeeping, where finished files
go when OUT is a bucket, and the refusal of a busy OUT. Pure: only `root.OutputRoot` changes files."""

from __future__ import annotations

import os
from typing import Protocol

from inspector.errors import OutputError
from inspector.parse.names import name_problem
from inspector.text import quoted

LOCK = ".zero-inspector.lock"
PARTIAL = ".partial"  # a file (or a job's folder) that is not finished yet
PART = ".part-"  # how a part's lock, journal and staging folder are named: PART + "I-of-N"
PROBE = ".zero-inspector-probe-"  # an empty folder made and removed at once: can a new entry be made here?
_LOCAL_ONLY = (".zero-inspector",)  # the lock and the journal: never published


class BusyError(OutputError):
    """Another run holds the output (its lock, or a part's): decided on by type, never by its words."""

    title = "Output folder in use"


class Destination(Protocol):
    """Where finished files go when OUT is not this folder (an object-store prefix, `remote.upload`)."""

    def publish(self, fd: int, size: int, crc: int, rel: str) -> None:
        """Make the open staged file `fd` (`size` bytes, CRC-32 `crc`) the output file `rel`, all at once."""
        ...

    def size_of(self, rel: str) -> int | None:
        """The size of `rel` once published (None when it was not)."""
        ...

    def holds(self, rel: str, size: int | None) -> bool:
        """Whether an earlier run of the same job already published `rel` (with `size` bytes, when given)."""
        ...


def local_only(rel: str) -> bool:
    """Bookkeeping that stays in the staging folder: locks, journals, stamps, partial and temporary files."""
    parts = [p for p in rel.split("/") if p]
    return any(p.startswith(_LOCAL_ONLY) or p.endswith((PARTIAL, ".tmp")) for p in parts)


def parts_of(rel: str) -> list[str]:
    """`rel` as name components, each checked by the one name rule (refused, never repaired)."""
    parts = [p for p in rel.split("/") if p]
    if not parts:
        raise OutputError("Internal error: an empty output path.")
    for p in parts:
        if problem := name_problem(p):
            raise OutputError(
                f"Refusing to write {quoted(rel, None)}: the name {quoted(p)} {problem}.",
                hint="A name from the checkpoint or from --rename cannot become a path outside the output "
                "folder; rename it with --rename.",
                title="Unsafe output name",
            )
    return parts


def missing_dirs(path: str) -> list[str]:
    """The folders `os.makedirs(path)` would create, deepest first."""
    missing = []
    while path and not os.path.lexists(path):
        missing.append(path)
        parent = os.path.dirname(path)
        if parent == path:
            break
        path = parent
    return missing


def entries(out_dir: str) -> list[str]:
    """The names in `out_dir` (sorted; none when it is not a folder) less the write probes of a run starting
    beside this one (the parts of a Slurm array): a probe lives for two system calls and is never output."""
    if not os.path.isdir(out_dir):
        return []
    return sorted(n for n in os.listdir(out_dir) if not n.startswith(PROBE))
