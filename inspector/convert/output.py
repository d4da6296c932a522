"""The safetensors output of a conversion: whether a folder may take it, what a previous run left, and the
journal that lets a killed run resume. Files are changed only through the run's `root.OutputRoot`.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
from collections.abc import Sequence

from inspector.convert.plan import INDEX_NAME, SINGLE_NAME, ConversionPlan
from inspector.convert.root import LOCK, Destination, OutputRoot, fd_crc32
from inspector.errors import InspectorError, OutputError
from inspector.system.source import open_in

PARTIAL = ".partial"
Part = tuple[int, int]  # (i, n): part i of n, 0 <= i < n
JOURNAL = ".zero-inspector-journal.json"
_OUR_NAMES = (SINGLE_NAME, INDEX_NAME)


def ours(name: str) -> bool:
    """Files a previous run of this tool may have left: shards, index, partials, journal."""
    base = name[: -len(PARTIAL)] if name.endswith(PARTIAL) else name
    return (
        base in _OUR_NAMES
        or name.startswith(JOURNAL)
        or name.startswith(LOCK)
        or (base.startswith("model-") and base.endswith(".safetensors") and "-of-" in base)
    )


def prepare_output(plan: ConversionPlan, out_dir: str, overwrite: bool) -> list[str]:
    """Check the output folder; returns stale files of ours to remove once the new output is in place."""
    if os.path.exists(out_dir) and not os.path.isdir(out_dir):
        raise OutputError(f"{out_dir} exists and is not a folder.", hint="Choose another output path.")
    real_out = os.path.realpath(out_dir)
    for f in plan.shards[0].tensors[:1]:
        if f.segments and os.path.dirname(os.path.realpath(f.segments[0].file)) == real_out:
            raise OutputError(
                "The output folder is the checkpoint's tag folder.",
                hint="Write the conversion to a separate folder.",
            )
    probe = out_dir
    while not os.path.exists(probe):  # created only when the run starts, so a refusal leaves nothing
        probe = os.path.dirname(probe)
    if not os.access(probe, os.W_OK):
        raise OutputError(f"{probe} is not writable.", hint="Choose a folder you can write to.")
    existing = sorted(os.listdir(out_dir)) if os.path.isdir(out_dir) else []
    foreign = [n for n in existing if not ours(n)]
    # partial files no run of this plan writes: another conversion's (another shard count), left by a kill or
    # still being written; published beside ours they would be taken for part of this output
    planned_partials = {n + PARTIAL for n in plan.filenames} | {INDEX_NAME + PARTIAL}
    foreign += [n for n in existing if n.endswith(PARTIAL) and n not in planned_partials]
    finals = [n for n in existing if ours(n) and not n.endswith(PARTIAL) and not _bookkeeping(n)]
    planned = set(plan.filenames)
    # a run of this very job killed while renaming its finished shards may have left some in place
    resumable = _peek_journal(out_dir).get("job") == plan.fingerprint and set(finals) <= planned
    if (foreign or finals) and not overwrite and not (resumable and not foreign):
        shown = ", ".join((foreign + finals)[:5]) + (" …" if len(foreign + finals) > 5 else "")
        raise OutputError(
            f"{out_dir} is not empty ({shown}).",
            hint="Choose an empty folder, or pass --overwrite to replace the files this conversion writes "
            "there (its safetensors and index; with --format model also config.json, generation_config.json "
            "and the tokenizer files); other files are left alone.",
            title="Output folder not empty",
        )
    return [n for n in finals if n not in planned] + [n for n in foreign if n.endswith(PARTIAL)]


def _bookkeeping(name: str) -> bool:
    return name.startswith((JOURNAL, LOCK))


def read_journal(root: OutputRoot) -> dict[str, object]:
    raw = root.read_small(JOURNAL, 16 << 20)
    try:
        data = json.loads(raw) if raw else {}
    except ValueError:
        return {}
    return data if isinstance(data, dict) else {}


def _peek_journal(out_dir: str) -> dict[str, object]:
    """The journal of a folder not yet taken (only to decide whether a rerun may go on there), opened through
    the input boundary: a link or a FIFO planted under its name is refused, never followed or waited on."""
    path = os.path.join(out_dir, JOURNAL)
    if not os.path.lexists(path):
        return {}
    try:
        fd = open_in(path)
    except (OSError, InspectorError):
        return {}
    try:
        data = json.loads(os.pread(fd, 16 << 20, 0))
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}
    finally:
        os.close(fd)


def file_crc32(path: str) -> int:
    """CRC-32 of a whole file (tests and tools; the writers checksum through their OutputRoot)."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    try:
        return fd_crc32(fd)
    finally:
        os.close(fd)


def disk_error(exc: OSError, out_dir: str, need: int) -> InspectorError:
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        free = shutil.disk_usage(out_dir).free
        return OutputError(
            f"Disk full while writing to {out_dir}: the output needs {need:,} bytes, {free:,} are free.",
            hint="Free disk space or choose another output folder; partial files were removed.",
            title="Disk full",
        )
    return OutputError(
        f"Writing to {out_dir} failed: {exc.strerror}.",
        hint="Check the output folder; partial files were removed.",
    )


def valid_partial(root: OutputRoot, rel: str, header: bytes, size: int, crc: int | None = None) -> bool:
    """A completed partial from an interrupted run of the same job: a regular file of the right size, identical
    header and, when given, the CRC-32 recorded when it was finished (a crash before the page cache reached the
    disk, or a disk error, changes bytes but neither size nor header)."""
    try:
        fd = root.open_read(rel)
    except (OSError, OutputError):
        return False
    try:
        if os.fstat(fd).st_size != size or os.pread(fd, len(header), 0) != header:
            return False
        return crc is None or fd_crc32(fd) == crc
    except OSError:
        return False
    finally:
        os.close(fd)


def part_indices(sizes: Sequence[int], part: Part) -> list[int]:
    """The files part `i` of `n` writes, given every file's size: a contiguous run, balanced by bytes (each
    part's first file is the one its share of the bytes starts in), so parts finish at about the same time.
    Every kind splits its files this way."""
    i, n = part
    total = sum(sizes)
    out, pos = [], 0
    for k, size in enumerate(sizes):
        if min((pos * n) // max(total, 1), n - 1) == i:
            out.append(k)
        pos += size
    return out


def part_shards(plan: ConversionPlan, part: Part) -> list[int]:
    """The shards part `i` of `n` writes."""
    return part_indices([s.file_bytes for s in plan.shards], part)


def part_suffix(part: Part) -> str:
    return f".part-{part[0]}-of-{part[1]}"


class OutputFolder:
    """One run's safetensors output inside its OutputRoot: locked for the whole run, cleared of other jobs'
    partial files, and its finished shards from an interrupted run of the same job checked (size, header,
    CRC-32) before they are reused. `release` gives it all back; after a failure it also removes the folders
    this run created if nothing else is in them.

    With `part` (i, n) it is one of n runs sharing the folder (a Slurm array, an indexed job): it takes a lock
    of its own, writes only its shards (`part_shards`) and journals each with its checksum in a journal of its
    own, and publishes nothing. The run without `part` then finishes the folder: it refuses while any part
    still holds its lock, and reuses every shard the part journals list with a matching checksum.

    With `fsync`, a shard reaches the disk before the journal names it, so it cannot be torn by a crash: the
    journal says so (`synced`), and a later run checks such a shard's size and header without re-reading it.
    That is what lets one node finish a folder N nodes wrote without reading their terabytes back."""

    def __init__(
        self,
        plan: ConversionPlan,
        out_dir: str,
        overwrite: bool,
        part: Part | None = None,
        fsync: bool = False,
        dest: Destination | None = None,
    ) -> None:
        self.plan = plan
        self.part = part
        self.fsync = fsync
        suffix = part_suffix(part) if part else ""
        self.journal = JOURNAL + suffix
        self.mine = set(part_shards(plan, part)) if part else set(range(len(plan.shards)))
        self.stale = prepare_output(plan, out_dir, overwrite)
        self.root = OutputRoot(out_dir, lock_name=LOCK + suffix, dest=dest)  # created, locked, held open
        self.out_dir = self.root.path
        try:
            self.root.refuse_running(part)
            self.stale = prepare_output(plan, out_dir, overwrite) if part is None else []
            self.partials = [s.filename + PARTIAL for s in plan.shards]
            self.reuse = self._reusable()
        except OSError as exc:
            self.release(ok=False)
            raise disk_error(exc, out_dir, plan.output_bytes) from None
        except BaseException:
            self.release(ok=False)
            raise
        self.sums = {
            s.filename: self._sums_before[s.filename]
            for s, r in zip(plan.shards, self.reuse, strict=True)
            if r
        }
        self.completed = [s.filename for s, r in zip(plan.shards, self.reuse, strict=True) if r]
        self.synced = [n for n in self.completed if n in self._synced_before]

    def release(self, ok: bool) -> None:
        self.root.release(ok)

    def _journals(self) -> list[dict[str, object]]:
        """This run's journal and, for the finishing run, every part's."""
        names = [self.journal]
        if self.part is None:
            names += [n for n in self.root.listdir() if n.startswith(JOURNAL + ".part-")]
        out = []
        for name in names:
            raw = self.root.read_small(name, 16 << 20)
            try:
                doc = json.loads(raw) if raw else {}
            except ValueError:
                continue
            if isinstance(doc, dict) and doc.get("job") == self.plan.fingerprint:
                out.append(doc)
        return out

    def _reusable(self) -> list[bool]:
        done_before: set[str] = set()
        self._sums_before: dict[str, int] = {}
        self._synced_before: set[str] = set()
        for doc in self._journals():
            listed, sums, synced = doc.get("complete"), doc.get("crc32"), doc.get("synced", [])
            if isinstance(listed, list) and isinstance(sums, dict):
                done_before |= {n for n in listed if isinstance(n, str)}
                self._sums_before |= {
                    k: v for k, v in sums.items() if isinstance(k, str) and isinstance(v, int)
                }
                if isinstance(synced, list):
                    self._synced_before |= {n for n in synced if isinstance(n, str) and n in listed}
        mine = {self.plan.shards[k].filename for k in self.mine}
        for name in self.root.listdir():  # partials of other jobs, or of shards we must redo (ours only)
            base = name[: -len(PARTIAL)]
            if name.endswith(PARTIAL) and base not in done_before and (base in mine or base == INDEX_NAME):
                self.root.remove(name)
        return [
            s.filename in done_before
            and s.filename in self._sums_before
            and valid_partial(
                self.root,
                p,
                s.header,
                s.file_bytes,
                None if s.filename in self._synced_before else self._sums_before[s.filename],
            )
            for s, p in zip(self.plan.shards, self.partials, strict=True)
        ]

    def record(self) -> None:
        """Write the journal: the shards finished so far and their checksums."""
        doc = {"job": self.plan.fingerprint, "complete": self.completed, "crc32": self.sums, "synced": self.synced}
        self.root.write_atomic(self.journal, json.dumps(doc).encode())

    def finished_parts(self) -> list[str]:
        """The part journals the finishing run consumed (removed once the output is published)."""
        return (
            [n for n in self.root.listdir() if n.startswith(JOURNAL + ".part-")] if self.part is None else []
        )

    def finished(self, index: int) -> None:
        """Shard `index` is completely written: checksum it (one re-read, from the page cache) and journal it.

        The last shard is not: the renames follow at once and the journal goes with them, so only a kill in
        that instant could want it, and then rewriting it is right. A one-shard output (anything up to
        --shard-size, 5 GB by default) so pays nothing for resumability."""
        if self.part is None and len(self.completed) + 1 == len(self.plan.shards):
            return
        name = self.plan.shards[index].filename
        self.sums[name] = self.root.crc32(self.partials[index])
        self.completed.append(name)
        if self.fsync:  # the writer fsynced the shard before this: on disk before the journal names it
            self.synced.append(name)
        self.record()
