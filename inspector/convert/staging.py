"""What a run takes over in OUT before it writes: the lock (one per `--part`), which files are its own (a part's
byte-balanced share), where each waits until published (`NAME.partial`, or a job's `FOLDER.partial/`), which
files an earlier run of the same job finished intact (the journal, or a bucket's listing), and the journal
this run keeps. The executor (`convert.executor`) writes and publishes; this decides and prepares.
"""

from __future__ import annotations

import errno
import os
import shutil
from collections.abc import Sequence
from typing import TYPE_CHECKING

from inspector.convert.journal import Entry, Journal
from inspector.convert.root import LOCK, PART, PARTIAL, BusyError, Destination, OutputRoot, fd_crc32
from inspector.errors import InspectorError, OutputError

if TYPE_CHECKING:
    from inspector.convert.job import OutputJob

Part = tuple[int, int]  # (i, n): part i of n, 0 <= i < n


def part_suffix(part: Part) -> str:
    """The one spelling of a part in a name (its lock, its journal, its staging folder)."""
    return f"{PART}{part[0]}-of-{part[1]}"


def part_indices(sizes: Sequence[int], part: Part) -> list[int]:
    """The files part `i` of `n` writes, given every file's size: a contiguous run, balanced by bytes (each
    part's first file is the one its share of the bytes starts in), so parts finish at about the same time."""
    i, n = part
    total = sum(sizes)
    out, pos = [], 0
    for k, size in enumerate(sizes):
        if min((pos * n) // max(total, 1), n - 1) == i:
            out.append(k)
        pos += size
    return out


def disk_error(exc: OSError, out_dir: str, need: int, words: str) -> InspectorError:
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        free = shutil.disk_usage(out_dir).free
        return OutputError(
            f"Disk full while writing to {out_dir}: the output needs {need:,} bytes, {free:,} are free.",
            hint=f"Free disk space or choose another output folder; {words}.",
            title="Disk full",
        )
    return OutputError(
        f"Writing to {out_dir} failed: {exc.strerror}.", hint=f"Check the output folder; {words}."
    )


class Staging:
    """One run's hold on OUT: the locked root, which files are this run's, where each waits until it is
    published, which an earlier run of the same job left reusable, and the journal it keeps."""

    def __init__(self, job: OutputJob, overwrite: bool, part: Part | None, fsync: bool, dest: Destination | None):
        self.job, self.part, self.fsync = job, part, fsync
        suffix = part_suffix(part) if part else ""
        job.check_output(overwrite)  # refused before the folder is even created
        self.root = OutputRoot(job.out_dir, lock_name=LOCK + suffix, dest=dest)  # created, locked, held open
        files = job.streamed
        self.mine = part_indices([f.nbytes for f in files], part) if part else list(range(len(files)))
        self.journal = Journal(self.root, job.identity, suffix, synced=fsync)
        self.renamed: list[str] = []  # finals this run put in place; removed again if a later step fails
        self.small: tuple[tuple[str, int], ...] = ()  # what `Job.before` wrote
        try:
            self.root.refuse_running(part)
            self.stale = job.leftovers(overwrite) if part is None else []
            self.area = self._open_area()
            self.staged = [self._staged(f.name) for f in files]
            self.reuse, kept = self._reusable()
            if dest is None:
                self.journal.start(kept)
        except OSError as exc:
            error = disk_error(exc, self.root.path, job.output_bytes, "nothing was written")
            self.root.release(ok=False)
            raise error from None
        except BaseException:
            self.root.release(ok=False)
            raise

    def _staged(self, name: str) -> str:
        """Where file `name` waits until it is published: beside it, or in the job's staging folder."""
        folder = self.job.folder
        if self.root.dest is not None or not folder:
            return name + PARTIAL
        return f"{folder}{PARTIAL}{name[len(folder) :]}"

    def _open_area(self) -> str:
        """The job's staging folder (a job with a `folder`): kept when it is this job's, started afresh when
        another job left it; a part never wipes it (the other parts share it), it refuses another job's."""
        folder = self.job.folder
        if not folder:
            return ""
        area = folder if self.root.dest is not None else folder + PARTIAL
        jobs = self.journal.jobs()  # before this run's journal starts
        if self.root.lstat(area) is not None and (
            self.job.identity not in jobs if self.part is None else bool(jobs - {self.job.identity})
        ):
            if self.part is not None:
                raise BusyError(
                    f"{self.root.show(area)} holds an unfinished export of another job.",
                    hint="Finish or remove it (a run without --part replaces it), then start the parts again.",
                )
            self.root.remove_tree(area)
        self.root.mkdirs(area)
        return area

    def _reusable(self) -> tuple[list[bool], dict[str, Entry]]:
        """Which files an earlier run of this job finished (the bucket says so for a bucket, else the
        journals and the files themselves); a staged file of ours that is not reusable is removed."""
        job, root, files = self.job, self.root, self.job.streamed
        mine = set(self.mine)  # thousands of files: a list's `in` made this loop quadratic
        if root.dest is not None:
            dest = root.dest
            return [
                k in mine and dest.holds(files[k].name, files[k].nbytes if files[k].exact else None)
                for k in range(len(files))
            ], {}
        before = self.journal.previous(finishing=self.part is None)
        reuse, kept = [False] * len(files), {}
        stale: list[str] = []
        for k, f in enumerate(files):
            entry = before.get(f.name)
            if entry is not None and self._intact(k, entry):
                reuse[k], kept[f.name] = True, entry
            elif k in mine:
                stale += (self.staged[k], self.staged[k] + ".tmp")
        root.remove_all(stale)
        if job.folder and self.part is None:  # whatever a killed writer left half-done
            for rel in list(root.walk_files(self.area)):
                if rel.endswith(".tmp"):
                    root.remove(rel)
        return reuse, kept

    def _intact(self, k: int, entry: Entry) -> bool:
        """A regular file (not a link) with the size, first bytes and CRC-32 it was finished with. The CRC is
        read back even for a file fsynced before it was journalled: between its part and this run anything may
        have changed it (a disk error, a hand, another tool), and a changed byte keeps size and header."""
        f, rel, head = self.job.streamed[k], self.staged[k], self.job.head(k)
        size, crc, _synced = entry
        try:
            fd = self.root.open_read(rel)
        except (OSError, OutputError):
            return False
        try:
            if os.fstat(fd).st_size != size or (f.exact and size != f.nbytes):
                return False
            if head and os.pread(fd, len(head), 0) != head:
                return False
            return fd_crc32(fd) == crc
        except OSError:
            return False
        finally:
            os.close(fd)
