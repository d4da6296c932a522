"""OUT on an object store (`s3://`, `gs://` or `az://bucket/prefix`), for every output kind, without the kinds
knowing.

The kind plans its job into a private staging folder (below `--staging DIR`, or the system's temporary
folder), and `BucketJob` wraps that job: the writers write there through their OutputRoot as always, and the
root publishes every finished file to the bucket through the scheme's `Destination`
(`remote.upload.destination_for`: multipart, conditional, aborted on failure) and drops the staged copy, so the local disk holds a file or a few, never the
model. Around the run it checks the prefix (no object of someone else's at a planned key without
--overwrite), aborts uploads a killed run of ours left open, and after a failure, cancel or interrupt removes
what it uploaded, so a half-written output is never visible. After a hard kill, the same command resumes:
objects this job completed (their metadata names the job) are kept, not written again.

With `--part I/N` (N runs, on one machine or many; `--executor ray`'s tasks) each part stages in a folder of
its own (the part in its name, so parts on one machine neither share a lock nor a folder), uploads only its
share and, on failure, removes only the objects it made. The finishing run (no part) is an ordinary resume:
the bucket's listing and each object's metadata (job, size, CRC-32, proven by the store's checksum on s3://,
by reading the object back on gs:// and az://) say which files the parts completed, so they are not uploaded
again; it writes what is missing, then the index and side files.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import tempfile
import threading
from collections.abc import Iterator
from typing import Any

from inspector.convert.executor import Progress, Report
from inspector.convert.kinds.base import Job, OutputKind, PlannedFile, Request
from inspector.convert.preflight import Assessment
from inspector.convert.root import LOCK, BusyError, Destination, OutputRoot
from inspector.convert.staging import Part, part_suffix
from inspector.errors import InvalidOptionError
from inspector.remote.roots import absolute
from inspector.scan.model import Checkpoint
from inspector.system.bytesource import is_url
from inspector.system.limits import MemoryBudget, free_disk_bytes

STAGING = "zero-inspector-staging-"


def staging_for(url: str, staging: str | None = None, part: Part | None = None) -> str:
    """The private folder a conversion to `url` stages its files in: one per destination (and part), so a
    second run to the same URL on this machine is refused by its lock rather than mixed in, while the N parts
    of one job on one machine each have their own."""
    base = os.path.abspath(os.path.expanduser(staging)) if staging else tempfile.gettempdir()
    name = STAGING + hashlib.sha256(url.encode()).hexdigest()[:12] + (part_suffix(part) if part else "")
    return os.path.join(base, name)


def plan_output(
    kind: OutputKind,
    ckpt: Checkpoint,
    request: Request,
    out: str,
    staging: str | None = None,
    part: Part | None = None,
) -> Job:
    """The kind's job for OUT: as planned for a local folder, or wrapped to upload to a bucket (`part`: the
    `--part` it will run, which names its staging folder; a local OUT's job runs any part)."""
    if not is_url(out):
        if staging:
            raise InvalidOptionError(
                "--staging is for an s3:// output; a local output is written in place.",
            )
        return kind.plan(ckpt, request, os.path.abspath(os.path.expanduser(out)))
    from inspector.remote.destination import require_writable

    url = absolute(out)
    require_writable(url)  # fsspec URLs are read, never written
    folder = staging_for(url, staging, part)
    return BucketJob(kind.plan(ckpt, request, folder), url, folder, part)


class BucketJob(Job):
    """A job whose OUT is a bucket prefix: the inner job writes into `staging`, every file is published."""

    def __init__(self, inner: Job, url: str, staging: str, part: Part | None = None) -> None:
        self.inner = inner
        self.url = url
        self.staging = staging
        self.part = part  # the part this job's staging folder is for (None: one run, or the finishing run)
        self.kind = inner.kind
        self.out_dir = url
        self.uses_selection = inner.uses_selection
        self.workers = inner.workers
        self.notes = (
            *inner.notes,
            f"Each file is uploaded to {url} as soon as it is written (multipart, nothing visible until "
            f"complete); {staging} holds at most {inner.workers} file(s) at a time.",
        )

    def __getattr__(self, name: str) -> Any:  # what a face reads of a particular kind (a plan's aliases)
        if name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)

    @property
    def files(self) -> tuple[PlannedFile, ...]:
        return self.inner.files

    @property
    def tensor_count(self) -> int:
        return self.inner.tensor_count

    @property
    def output_bytes(self) -> int:
        return self.inner.output_bytes

    @property
    def identity(self) -> str:
        return self.inner.identity

    @property
    def where(self) -> str:
        return self.public(self.inner.where)

    def writer(self) -> Any:
        return self.inner.writer()

    def public(self, path: str) -> str:
        """A staging path as the URL it stands for."""
        if path == self.staging or path.startswith(self.staging + os.sep):
            return self.url + path[len(self.staging) :].replace(os.sep, "/")
        return path

    def _names(self) -> list[str]:
        return [f.name for f in self.files]

    def destination(self, overwrite: bool, cancel: threading.Event | None = None) -> Any:
        from inspector.remote.destination import destination_for

        return destination_for(self.url, self.identity, overwrite, cancel)

    def check_output(self, overwrite: bool) -> None:
        """No object of anyone else's at a planned key (without --overwrite); reads the bucket, writes nothing."""
        self.destination(overwrite).check(self._names())

    def assess(self, budget: MemoryBudget | None = None, free_disk: int | None = None) -> Assessment:
        from inspector.remote.destination import base_part, upload_inflight

        free = free_disk if free_disk is not None else free_disk_bytes(self.staging)
        a = self.inner.assess(budget, free)
        largest = sorted((f.nbytes for f in self.files), reverse=True)[: self.inner.workers]
        staged = sum(largest)
        buffers = upload_inflight() * base_part()  # parts read from the staged files, in flight
        return dataclasses.replace(
            a,
            predicted_peak_rss=a.predicted_peak_rss + buffers,
            predicted_vms=a.predicted_vms + buffers,
            fits_memory=a.fits_memory and a.memory_margin >= buffers,
            upload_to=self.url,
            staged_bytes=staged,
            fits_disk=staged <= a.free_disk and not a.unwritable,
        )

    def comparisons(self, verdict: Assessment) -> tuple[tuple[str, int, str], ...]:
        return self.inner.comparisons(verdict)

    def read_note(self, verdict: Assessment) -> str:
        return self.inner.read_note(verdict)

    def preflight_json(self) -> dict[str, Any]:
        return self.inner.preflight_json()

    def run(
        self,
        *,
        cancel: threading.Event | None = None,
        overwrite: bool = False,
        fsync: bool = False,
        part: tuple[int, int] | None = None,
        dest: Destination | None = None,
    ) -> Iterator[Progress | Report]:
        """The inner job's events, its files published as they finish; the report names the bucket. On any
        failure, cancel or interrupt the open uploads are aborted and this run's objects removed."""
        if part != self.part:  # the staging folder was named for a part at planning (plan_output)
            raise InvalidOptionError(
                f"Internal error: a job planned for part {self.part} run as part {part}."
            )
        cancel = cancel or threading.Event()
        bucket = self.destination(overwrite, cancel)
        base, name = os.path.split(self.staging)
        # one run per destination (and part) on this machine; a part and the finishing run exclude each other
        # as in a shared folder (`refuse_running`); across machines, the finishing run goes after the parts
        lock = f"{LOCK}.{name}"
        outer = None
        try:
            outer = OutputRoot(base, lock_name=lock)
            outer.refuse_running(part, lock.removesuffix(part_suffix(part)) if part else lock)
        except BaseException as exc:
            if outer is not None:
                outer.release(ok=True)
            if isinstance(exc, BusyError):
                raise BusyError(
                    f"Another conversion on this machine is writing to {self.url}.",
                    hint="Wait for it to finish; two runs into one prefix would replace each other's objects "
                    "(the finishing run of --part goes once every part has ended).",
                ) from None
            raise
        ok = False
        try:
            outer.remove_tree(name)  # a killed run's leftovers: the bucket says what is finished, not they
            # a part leaves the others' open uploads alone; the finishing run aborts what a killed run left
            bucket.check(self._names(), abort_stale=part is None)
            for ev in self.inner.run(cancel=cancel, overwrite=overwrite, fsync=fsync, part=part, dest=bucket):
                if isinstance(ev, Report):  # everything is up: a consumer that stops here undoes nothing
                    ok = True
                    ev = dataclasses.replace(
                        ev, out_dir=self.public(ev.out_dir), resumed_shards=len(bucket.reused)
                    )
                yield ev
        except BaseException:
            if not ok:
                cancel.set()
            raise
        finally:
            if ok:
                bucket.close()
            else:
                bucket.abandon()
            outer.remove_tree(name)
            outer.release(ok=True)

    keeps_on_cancel = False

    def cancelled_words(self) -> str:
        return f"open uploads were aborted and nothing this run uploaded is left in {self.url}"

    def finished_words(self, report: Report) -> str:
        words = self.inner.finished_words(report)
        if not words:
            return f"Uploaded to {self.where}."
        # what the kind says about loading it names local paths: the copy a user makes of the prefix
        return f"Uploaded to {self.where}. Copied down ({_sync(self.url)} DIR): " + words.replace(
            self.staging, "DIR"
        )


def _sync(url: str) -> str:
    """The store's own command that copies the prefix down."""
    tool = {"gs": "gcloud storage rsync -r", "az": "azcopy sync"}.get(url.partition(":")[0], "aws s3 sync")
    return f"{tool} {url}"
