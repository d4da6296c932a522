"""The one executor: every output kind's job runs here, from the locked output folder to the last rename.

A job offers its files (`OutputJob.streamed`, `convert/job.py`: written one by one, in publish order) and how to write file *i* into
the OutputRoot (`OutputJob.writer`); this owns everything around them, for every kind:

- the lock: OUT is held by one run (`--part I/N`: one lock per part; the finishing run refuses while a part
  runs, and a part while it does);
- parts: part *i* of *n* writes a contiguous, byte-balanced run of the files (`part_indices`) and publishes
  nothing; the run without a part finishes the folder, reusing what the parts journalled;
- the journal (`journal.Journal`, one name, inside the root): each finished file with its size and CRC-32, so
  a rerun after a kill reuses a file only if it still has those bytes;
- staging: a file waits as `NAME.partial` beside its final name or, for a job with a `folder`, in
  `FOLDER.partial/`, renamed whole; nothing half-written ever carries a final name;
- publishing to a bucket (`dest`): each file goes up the moment it is finished, in file order, and a file the
  bucket already holds for this job is not written again;
- progress: one `Progress` shape at most ~4 times a second, then one `Report`; cancel and errors remove what
  the run wrote (or keep the finished files for a rerun: `OutputJob.keeps_on_cancel`).

torch is not imported: it would cost seconds and ~300-600 MiB.
"""

from __future__ import annotations

import contextlib
import functools
import queue
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field

from inspector.convert.job import FileWriter, OutputJob, PlannedFile, Writing
from inspector.convert.root import PARTIAL, Destination
from inspector.convert.staging import Part, Staging, disk_error
from inspector.errors import CancelledError

_EVENT_INTERVAL = 0.25


@dataclass(frozen=True)
class Progress:
    """A snapshot for meters: bytes written of the total, the current tensor and file, throughput."""

    bytes_done: int
    bytes_total: int
    tensor: str
    shard: str
    shard_index: int
    shards: int
    elapsed: float
    skipped_bytes: int = 0
    files_done: int = 0  # of `files_total`, finished (reused and written first included): never goes back
    files_total: int = 0  # the files the run lists (the job's, or a part's own): the count the header says

    @property
    def fraction(self) -> float:
        return self.bytes_done / self.bytes_total if self.bytes_total else 1.0

    @property
    def throughput(self) -> float:
        """Bytes per second actually converted in this run (reused files excluded)."""
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




def run(
    job: OutputJob,
    *,
    cancel: threading.Event | None = None,
    overwrite: bool = False,
    fsync: bool = False,
    part: Part | None = None,
    dest: Destination | None = None,
) -> Iterator[Progress | Report]:
    """Carry out `job`, yielding Progress events (<= 4/s) and finally a Report (see the module's words).
    Renames make a killed process safe; `fsync` also makes the output survive a power cut."""
    cancel = cancel or threading.Event()
    r = Staging(job, overwrite, part, fsync, dest)
    root, files = r.root, job.streamed
    todo = [k for k in r.mine if not r.reuse[k]]
    total = sum(files[k].nbytes for k in r.mine)
    skipped = total - sum(files[k].nbytes for k in todo)
    start = time.monotonic()
    ok = False
    try:
        if part is None:
            r.small = job.before(root, r.area, fsync)
        count = len(job.files) if part is None else len(r.mine)
        early = len(r.small) + len(r.mine) - len(todo)  # written first, or reused
        yield from _write_all(r, todo, cancel, (total, skipped, count, early), start)
        if cancel.is_set():
            raise CancelledError(f"Conversion cancelled; {job.cancelled_words()}.")
        if part is not None:  # the finishing run publishes; a part only leaves its journalled files
            ok = True
            yield _part_report(r, start)
            return
        side = _publish(r)
        ok = True
        elapsed = time.monotonic() - start
        last = len(files) - 1
        name = files[last].name if files else ""
        yield Progress(total, total, "", name, last, len(files), elapsed, skipped, count, count)
        names = [f.name for f in files]
        listed = tuple(zip(names, root.sizes(names), strict=True)) + r.small
        if job.folder:  # one entry for the folder
            listed = ((job.folder, sum(s for _, s in listed)),)
        listed += side
        written = sum(s for _, s in listed)
        yield Report(job.where, listed, job.tensor_count, written, elapsed, sum(r.reuse), tuple(r.stale))
    except OSError as exc:
        raise disk_error(exc, root.path, job.output_bytes, _words(job)) from None
    finally:
        if not ok and not job.keeps_on_cancel:
            after = [f.name + ".tmp" for f in job.files]  # an index or a side file cut short
            for name in (
                *(r.staged[k] for k in r.mine),
                *r.renamed,
                r.journal.name,
                r.journal.name + ".tmp",
                *after,
            ):
                with contextlib.suppress(OSError):
                    root.remove(name)
        root.release(ok)


def _words(job: OutputJob) -> str:
    return "rerun the same command to resume" if job.keeps_on_cancel else "partial files were removed"


def _write_all(
    r: Staging, todo: list[int], cancel: threading.Event, counts: tuple[int, int, int, int], start: float
) -> Iterator[Progress]:
    """Write the `todo` files, `job.writers` at once, yielding progress while they run; a bucket gets them in
    file order. An interrupt, or a consumer that stops listening, cancels the writers and waits for them.
    `counts`: bytes in all and reused, files listed and done before the first is written."""
    total, skipped, listed, early = counts
    job, files = r.job, r.job.streamed
    tally = _Tally(skipped, todo[0] if todo else 0, len(todo), (early, listed))
    news = threading.Event()  # a file ended (bytes written are only tallied: the loop reports them on its
    # tick; waking it for every chunk had it scan every file's future ~400,000 times in a 2.8 GB universal
    # export, a few tenths of a CPU-second taken from the writers)
    turns = _Turns() if r.root.dest is not None else None
    one = functools.partial(_write_one, r, tally, turns, news, cancel)
    with (
        job.writer() as write,
        ThreadPoolExecutor(max(1, job.writers(r.root.dest)), thread_name_prefix="zi-write") as pool,
    ):
        futures = [pool.submit(one, t, k, write) for t, k in enumerate(todo)]
        ended: queue.SimpleQueue[Future[None]] = queue.SimpleQueue()  # each future once, as it ends: the
        # loop's work is per file, never per file per wake-up (2,000 files would be 4 million checks)
        for fut in futures:
            fut.add_done_callback(ended.put)
            fut.add_done_callback(lambda _: news.set())
        try:
            last, left = 0.0, len(futures)
            while left:
                news.wait(_EVENT_INTERVAL)  # bounded: an interrupt is seen within it
                news.clear()
                left -= _raise_first_error(ended)
                if (
                    turns is not None
                ):  # a bucket: up in file order, from this thread (an interrupt lands here)
                    turns.publish(lambda t: r.root.replace(r.staged[todo[t]], files[todo[t]].name))
                now = time.monotonic()
                if now - last < _EVENT_INTERVAL or not left:
                    continue  # at most ~4 a second, and none just before the run's last
                last = now
                yield tally.event(total, files, now - start, skipped)
            for fut in futures:
                fut.result()
        except BaseException:
            cancel.set()
            for fut in futures:
                fut.cancel()
            wait(futures)
            raise


def _write_one(
    r: Staging,
    tally: _Tally,
    turns: _Turns | None,
    news: threading.Event,
    cancel: threading.Event,
    turn: int,
    k: int,
    write: FileWriter,
) -> None:
    """One writer's file `k`: written into its staged name, tallied as it goes, then recorded (and, for a
    bucket, handed in for its upload in file order)."""
    if cancel.is_set():
        return
    counted = [0]

    def progress(n: int, tensor: str) -> None:
        counted[0] += n
        with tally.lock:
            tally.done += n
            tally.tensor, tally.file = tensor, k

    writing = Writing(cancel, r.fsync, progress)
    write(k, r.root, r.staged[k], writing)
    if not cancel.is_set():
        _finished(r, k, counted[0], tally, writing.known)
    if turns is not None and not cancel.is_set():  # its upload is the run's own thread's
        news.set()
        turns.hand_in(turn, cancel)


def _raise_first_error(ended: queue.SimpleQueue[Future[None]]) -> int:
    """How many writers ended since the last call; raises the first one's error."""
    count = 0
    while True:
        try:
            fut = ended.get_nowait()
        except queue.Empty:
            return count
        count += 1
        if (exc := fut.exception()) is not None:
            raise exc


class _Tally:
    """Bytes done, the tensor and file in hand, files left: shared by the writers, read by the events."""

    def __init__(self, done: int, file: int, left: int, files: tuple[int, int]) -> None:
        self.done, self.tensor, self.file, self.left = done, "", file, left
        self.finished, self.listed = files  # files finished of those listed: counted, never the file in hand
        self.lock = threading.Lock()

    def event(self, total: int, files: tuple[PlannedFile, ...], elapsed: float, skipped: int) -> Progress:
        with self.lock:
            done, tensor, k, finished = self.done, self.tensor, self.file, self.finished
        count = (min(finished, self.listed), self.listed)
        return Progress(
            min(done, total), total, tensor, files[k].name, k, len(files), elapsed, skipped, *count
        )


def _finished(r: Staging, k: int, counted: int, tally: _Tally, known: list[tuple[int, int]]) -> None:
    """File `k` is written: counted at its planned size, and (not to a bucket, which keeps its own record)
    checksummed and journalled, with the (size, CRC-32) its writer computed on the bytes in hand when it did
    (`Writing.checksummed`), else read back. The last one of a whole run is not: it is renamed at once, and a
    kill in that instant rewrites it, so a one-file output pays nothing for resumability."""
    f, rel = r.job.streamed[k], r.staged[k]
    with tally.lock:
        tally.done += f.nbytes - counted
        tally.left -= 1
        tally.finished += 1
        last = tally.left == 0
    if r.root.dest is None and not (last and r.part is None):
        size, crc = known[0] if known else (r.root.size(rel), r.root.crc32(rel))
        r.journal.finished(f.name, size, crc)


def _part_report(r: Staging, start: float) -> Report:
    """A part's files stay staged (or are up already, in a bucket) until the finishing run."""
    job, root = r.job, r.root
    names = [job.streamed[k].name if root.dest is not None else r.staged[k] for k in r.mine]
    listed = tuple(zip(names, root.sizes(names), strict=True))
    where = root.path
    if job.folder:
        where = job.where if root.dest is not None else job.where + PARTIAL
    elapsed = time.monotonic() - start
    return Report(
        where,
        listed,
        job.tensors_in(r.mine),
        sum(s for _, s in listed),
        elapsed,
        sum(r.reuse[k] for k in r.mine),
    )


def _publish(r: Staging) -> tuple[tuple[str, int], ...]:
    """Put the finished files in place under their final names (a folder all at once), then what the job
    writes last (an index, side files, a pointer to the folder), remove stale outputs and the journals."""
    job, root = r.job, r.root
    if root.dest is None:
        if job.folder:
            if root.lstat(job.folder) is not None:  # only with --overwrite (check_output said so)
                root.remove_tree(job.folder)
            root.replace(r.area, job.folder)
            r.renamed.append(job.folder)
        else:
            for f, staged in zip(job.streamed, r.staged, strict=True):
                root.replace(staged, f.name)
                r.renamed.append(f.name)
    for name in r.journal.names():  # this run's and every part's
        root.remove(name)
    side = job.after(root, r.fsync)
    for name in r.stale:
        root.remove(name)
    if r.fsync:
        root.fsync_dir()
    return side


class _Turns:
    """Files written side by side by the workers, published (uploaded) one after the other in file order by
    the run's own thread, so an interrupt lands in the upload itself. A writer waits until its file is up, so
    the staging folder holds at most one file per worker; cancel ends the wait."""

    def __init__(self) -> None:
        self.next = 0
        self.ready: set[int] = set()
        self.cond = threading.Condition()

    def hand_in(self, turn: int, cancel: threading.Event) -> None:
        """A writer's file is complete: wait until it is published."""
        with self.cond:
            self.ready.add(turn)
            while self.next <= turn:
                if cancel.is_set():
                    raise CancelledError("Conversion cancelled.")
                self.cond.wait(0.1)

    def publish(self, put: Callable[[int], None]) -> None:
        """Publish every file handed in whose predecessors are up, in order."""
        while True:
            with self.cond:
                if self.next not in self.ready:
                    return
                turn = self.next
            put(turn)
            with self.cond:
                self.next += 1
                self.cond.notify_all()


def execute(job: OutputJob, **kw: object) -> Report:
    """Run to completion without progress events (scripts, tests)."""
    report = None
    for ev in run(job, **kw):  # type: ignore[arg-type]
        if isinstance(ev, Report):
            report = ev
    assert report is not None
    return report
