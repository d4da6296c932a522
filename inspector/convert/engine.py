"""Execute a ConversionPlan: the run around the shards, from the locked output folder to the final rename.

`pipeline` streams each shard's bytes (read, cast, write; flat memory); this module decides which shards
still need writing (the journal lets a rerun reuse complete ones), turns their byte counts into Progress
events at most ~4 times a second, honours cancel, and publishes the result: shards are written as
`*.partial` and renamed only when all are complete, the index comes last, and a failed run removes what it
wrote. torch is not imported: it would cost seconds and ~300-600 MiB.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from inspector.convert.output import JOURNAL, OutputFolder, Part
from inspector.convert.output import disk_error as _disk_error
from inspector.convert.pipeline import shard_streamer
from inspector.convert.plan import INDEX_NAME, ConversionPlan
from inspector.convert.root import Destination, OutputRoot
from inspector.errors import CancelledError

_EVENT_INTERVAL = 0.25


@dataclass(frozen=True)
class Progress:
    """A snapshot for meters: bytes written of the total, the current tensor and shard, throughput."""

    bytes_done: int
    bytes_total: int
    tensor: str
    shard: str
    shard_index: int
    shards: int
    elapsed: float
    skipped_bytes: int = 0

    @property
    def fraction(self) -> float:
        return self.bytes_done / self.bytes_total if self.bytes_total else 1.0

    @property
    def throughput(self) -> float:
        """Bytes per second actually converted in this run (resumed shards excluded)."""
        done = self.bytes_done - self.skipped_bytes
        return done / self.elapsed if self.elapsed > 0 else 0.0


@dataclass(frozen=True)
class Report:
    """What a finished run did."""

    out_dir: str
    files: tuple[tuple[str, int], ...]
    tensors: int
    bytes_written: int
    seconds: float
    resumed_shards: int = 0
    removed_stale: tuple[str, ...] = field(default=())


ShardWriter = Callable[[int, int, threading.Event, bool], Iterator[tuple[int, str]]]


def run(
    plan: ConversionPlan,
    out_dir: str,
    *,
    cancel: threading.Event | None = None,
    overwrite: bool = False,
    fsync: bool = False,
    shard_writer: ShardWriter | None = None,
    side_writer: Callable[[OutputRoot], tuple[tuple[str, int], ...]] | None = None,
    part: Part | None = None,
    dest: Destination | None = None,
) -> Iterator[Progress | Report]:
    """Carry out `plan` into `out_dir`, yielding Progress events (<= 4/s) and finally a Report.

    `shard_writer(index, fd, cancel, fsync)` fills one shard's open file and yields (bytes, tensor) as
    it goes; the default streams checkpoint bytes (`pipeline.write_shard`), a merged model computes them.
    `side_writer(root)` writes the files beside the weights (config, tokenizer) once the weights are in
    place, under the same lock, so a failed run never leaves a config that looks loadable.
    Whatever writes the bytes, this owns the run around them: the locked OutputRoot, the journal, resume,
    the renames and the cleanup. On any error, cancel or interrupt, the partial files are removed before the
    exception propagates. After a hard kill, rerunning the same job reuses the shards the journal lists as
    complete. Renames make a killed process safe; `fsync` also makes the output survive a power cut.

    `part` (i, n): write only this part's shards, journalled with their checksums, and publish nothing; the
    same call without `part`, after every part, finishes the folder and reuses them (`output.OutputFolder`).

    `dest` (OUT is a bucket: `out_dir` is the staging folder): each shard is published the moment it is
    complete, in file order, so the staging folder holds one shard at a time; the shards an earlier run of
    this job completed there are not written again (the bucket, not the staging folder, says which). With
    `part` too, the part publishes its own shards that way and nothing else; the finishing run reuses them.
    """
    cancel = cancel or threading.Event()
    write = shard_writer or shard_streamer(plan)
    folder = OutputFolder(plan, out_dir, overwrite, part, fsync, dest)  # created, locked, stale partials removed
    root = folder.root
    out_dir = root.path
    stale, partial, reuse, mine = folder.stale, folder.partials, folder.reuse, sorted(folder.mine)
    if dest is not None:  # the bucket says which of this run's shards the job completed before (a part's own)
        reuse = [k in folder.mine and dest.holds(s.filename, s.file_bytes) for k, s in enumerate(plan.shards)]
    total = sum(plan.shards[i].file_bytes for i in mine)  # the index is written at once, after them
    skipped = sum(plan.shards[i].file_bytes for i in mine if reuse[i])
    start = time.monotonic()
    ok = False
    renamed: list[str] = []  # finals this run put in place; removed again if a later step fails
    try:
        folder.record()
        done = skipped
        last = 0.0
        for i in mine:
            shard = plan.shards[i]
            if reuse[i]:
                continue
            fd = root.create(partial[i])
            try:
                for nbytes, tensor in write(i, fd, cancel, fsync):
                    done += nbytes
                    now = time.monotonic()
                    if now - last >= _EVENT_INTERVAL:
                        last = now
                        yield Progress(
                            done, total, tensor, shard.filename, i, len(plan.shards), now - start, skipped
                        )
            finally:
                os.close(fd)
            if dest is not None:  # up now, in file order: the staging folder never holds the model
                root.replace(partial[i], shard.filename)
                renamed.append(shard.filename)
            else:
                folder.finished(i)
        if cancel.is_set():
            raise CancelledError("Conversion cancelled; partial files were removed.")
        if part is not None:  # the finishing run publishes; a part only leaves its journalled shards
            ok = True
            # a bucket has each of them up already (size from the upload, or the listing for a reused one)
            names = [plan.shards[i].filename if dest is not None else partial[i] for i in mine]
            files = tuple((name, root.size(name)) for name in names)
            elapsed = time.monotonic() - start
            yield Report(
                out_dir,
                files,
                sum(len(plan.shards[i].tensors) for i in mine),
                sum(s for _, s in files),
                elapsed,
                sum(reuse[i] for i in mine),
            )
            return
        _publish(plan, root, partial, renamed, stale, fsync)
        for name in folder.finished_parts():
            root.remove(name)
        side = side_writer(root) if side_writer is not None else ()
        ok = True
        files = tuple((f, root.size(f)) for f in plan.filenames) + side
        elapsed = time.monotonic() - start
        yield Progress(
            total,
            total,
            "",
            plan.shards[-1].filename,
            len(plan.shards) - 1,
            len(plan.shards),
            elapsed,
            skipped,
        )
        yield Report(
            out_dir, files, plan.tensor_count, sum(s for _, s in files), elapsed, sum(reuse), tuple(stale)
        )
    except OSError as exc:  # journal, rename or index write: a clear message, not a traceback
        raise _disk_error(exc, out_dir, plan.output_bytes) from None
    finally:
        if not ok:
            _discard(root, [partial[i] for i in mine] + renamed, folder.journal)
        folder.release(ok)


def _publish(
    plan: ConversionPlan,
    root: OutputRoot,
    partial: list[str],
    renamed: list[str],
    stale: list[str],
    fsync: bool,
) -> None:
    """Rename the finished shards into place (appending each to `renamed`), write the index, remove stale
    outputs and the journal."""
    for shard, p in zip(plan.shards, partial, strict=True):
        if root.dest is not None:  # each went up as it was finished (or an earlier run had it there)
            continue
        root.replace(p, shard.filename)
        renamed.append(shard.filename)
    if plan.index is not None:
        root.write_atomic(INDEX_NAME, plan.index, fsync=fsync)
    for name in stale:
        root.remove(name)
    root.remove(JOURNAL)
    if fsync:
        root.fsync_dir()


def _discard(root: OutputRoot, names: list[str], journal: str = JOURNAL) -> None:
    """After a failed run: remove its partial and renamed files, its journal and the partial index."""
    for name in (*names, journal, journal + ".tmp", INDEX_NAME + ".tmp"):
        with contextlib.suppress(OSError):
            root.remove(name)


def execute(
    plan: ConversionPlan,
    out_dir: str,
    *,
    cancel: threading.Event | None = None,
    overwrite: bool = False,
    fsync: bool = False,
) -> Report:
    """Run to completion without progress events (scripts, tests)."""
    report = None
    for ev in run(plan, out_dir, cancel=cancel, overwrite=overwrite, fsync=fsync):
        if isinstance(ev, Report):
            report = ev
    assert report is not None
    return report
