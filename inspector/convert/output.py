"""The output folder of a conversion: who may write there, what a previous run left, and the journal that
lets a killed run resume. The engine streams bytes; this module owns the folder around them.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import zlib

from inspector.convert.plan import INDEX_NAME, SINGLE_NAME, ConversionPlan
from inspector.errors import InspectorError, OutputError

PARTIAL = ".partial"
JOURNAL = ".zero-inspector-journal.json"
LOCK = ".zero-inspector.lock"
_OUR_NAMES = (SINGLE_NAME, INDEX_NAME)
_CRC_BLOCK = 8 * 1024 * 1024


def ours(name: str) -> bool:
    """Files a previous run of this tool may have left: shards, index, partials, journal."""
    base = name[: -len(PARTIAL)] if name.endswith(PARTIAL) else name
    return (
        base in _OUR_NAMES
        or name.startswith(JOURNAL)
        or name == LOCK
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
    finals = [n for n in existing if ours(n) and not n.endswith(PARTIAL) and not _bookkeeping(n)]
    planned = set(plan.filenames)
    # a run of this very job killed while renaming its finished shards may have left some in place
    resumable = read_journal(out_dir).get("job") == plan.fingerprint and set(finals) <= planned
    if (foreign or finals) and not overwrite and not (resumable and not foreign):
        shown = ", ".join((foreign + finals)[:5]) + (" …" if len(foreign + finals) > 5 else "")
        raise OutputError(
            f"{out_dir} is not empty ({shown}).",
            hint="Choose an empty folder, or pass --overwrite to replace model*.safetensors and "
            "the index there (other files are left alone).",
            title="Output folder not empty",
        )
    return [n for n in finals if n not in planned]


def _bookkeeping(name: str) -> bool:
    return name.startswith(JOURNAL) or name == LOCK


def read_journal(out_dir: str) -> dict[str, object]:
    try:
        with open(os.path.join(out_dir, JOURNAL)) as fh:
            data = json.load(fh)
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def write_journal(
    out_dir: str, plan: ConversionPlan, done: list[str], sums: dict[str, int] | None = None
) -> None:
    """Record the shards finished so far, each with the CRC-32 of its complete file."""
    tmp = os.path.join(out_dir, JOURNAL + ".tmp")
    with open(tmp, "w") as fh:
        json.dump({"job": plan.fingerprint, "complete": done, "crc32": sums or {}}, fh)
    os.replace(tmp, os.path.join(out_dir, JOURNAL))


def file_crc32(path: str) -> int:
    """CRC-32 of a whole file, read in fixed 8 MiB blocks (flat memory; zlib releases the GIL)."""
    crc = 0
    buf = bytearray(_CRC_BLOCK)
    view = memoryview(buf)
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    try:
        offset = 0
        while n := os.preadv(fd, [view], offset):
            crc = zlib.crc32(view[:n], crc)
            offset += n
    finally:
        os.close(fd)
    return crc


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


def valid_partial(path: str, header: bytes, size: int, crc: int | None = None) -> bool:
    """A completed partial from an interrupted run of the same job: right size, identical header and, when
    given, the CRC-32 recorded when it was finished (a crash before the page cache reached the disk, or a
    disk error, changes bytes but neither size nor header)."""
    try:
        if os.path.getsize(path) != size:
            return False
        with open(path, "rb") as fh:
            if fh.read(len(header)) != header:
                return False
        return crc is None or file_crc32(path) == crc
    except OSError:
        return False


def fsync_dir(path: str) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _missing_dirs(path: str) -> list[str]:
    """The folders `os.makedirs(path)` would create, deepest first."""
    missing = []
    while path and not os.path.exists(path):
        missing.append(path)
        parent = os.path.dirname(path)
        if parent == path:
            break
        path = parent
    return missing


def _lock(out_dir: str) -> int:
    """An exclusive `flock` on `out_dir/.zero-inspector.lock`, held until the descriptor closes.

    The kernel drops it when the process dies, so a SIGKILLed run never leaves a stale lock. A second run
    is refused at once. The file is unlinked on release, so after locking we check that the name still
    leads to the inode we locked (a racing release may have unlinked it in between); if not, retry.
    """
    import fcntl  # POSIX only, like the rest of the output path

    path = os.path.join(out_dir, LOCK)
    for _ in range(5):
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0), 0o644)
        except OSError as exc:
            raise OutputError(f"Cannot create the lock file {path}: {exc.strerror}.") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
            os.close(fd)
            who = f" (process {holder})" if holder.isdigit() else ""
            raise OutputError(
                f"Another conversion{who} is writing to {out_dir}.",
                hint="Wait for it to finish, or choose another output folder. Two runs in one folder would "
                "overwrite each other's files.",
                title="Output folder in use",
            ) from None
        except OSError as exc:
            os.close(fd)
            raise OutputError(
                f"Cannot lock {path}: {exc.strerror}.",
                hint="The file system does not support locks; choose an output folder on a local disk.",
            ) from None
        try:
            st = os.stat(path, follow_symlinks=False)
            mine = os.fstat(fd)
            same = (st.st_dev, st.st_ino) == (mine.st_dev, mine.st_ino)
        except FileNotFoundError:
            same = False
        if same:
            with contextlib.suppress(OSError):  # who holds it, for the refusal message; best effort
                os.ftruncate(fd, 0)
                os.write(fd, f"{os.getpid()}\n".encode())
            return fd
        os.close(fd)
    raise OutputError(f"Could not lock {path}: it keeps changing.", title="Output folder in use")


class FolderLock:
    """One run's claim on an output folder: created if needed and locked (`_lock`) for the whole run.
    `release` unlocks; after a failure it also removes the folders this run created if nothing is in them.
    Every writer (safetensors shards, universal checkpoints) takes its output folder through this."""

    def __init__(self, out_dir: str) -> None:
        self.out_dir = out_dir
        self.created = _missing_dirs(out_dir)
        try:
            os.makedirs(out_dir, exist_ok=True)
        except OSError as exc:
            raise OutputError(f"Cannot create {out_dir}: {exc.strerror}.") from None
        self._fd = -1
        try:
            self._fd = _lock(out_dir)
        except BaseException:
            self.created = []  # the folder may hold another run's files now; never remove it
            raise

    def release(self, ok: bool) -> None:
        """Unlock; after a failure also remove the folders this run created, if they are empty."""
        if self._fd >= 0:
            with contextlib.suppress(OSError):
                os.unlink(os.path.join(self.out_dir, LOCK))
            os.close(self._fd)
            self._fd = -1
        if not ok:
            for path in self.created:  # deepest first; stops at the first that is not empty
                try:
                    os.rmdir(path)
                except OSError:
                    break
        self.created = []


class OutputFolder(FolderLock):
    """One run's claim on its safetensors output folder: created if needed, locked for the whole run, cleared
    of other jobs' partial files, and its finished shards from an interrupted run of the same job checked
    (size, header, CRC-32) before they are reused. `release` gives it all back; after a failure it also
    removes the folders this run created if nothing else is in them."""

    def __init__(self, plan: ConversionPlan, out_dir: str, overwrite: bool) -> None:
        self.plan = plan
        self.stale = prepare_output(plan, out_dir, overwrite)
        super().__init__(out_dir)
        try:
            self.stale = prepare_output(plan, out_dir, overwrite)  # again, now that no one else writes
            self.partials = [os.path.join(out_dir, s.filename + PARTIAL) for s in plan.shards]
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

    def _reusable(self) -> list[bool]:
        journal = read_journal(self.out_dir)
        same_job = journal.get("job") == self.plan.fingerprint
        listed = journal.get("complete") if same_job else None
        sums = journal.get("crc32") if same_job else None
        done_before = set(listed) if isinstance(listed, list) else set()
        self._sums_before = (
            {k: v for k, v in sums.items() if isinstance(v, int)} if isinstance(sums, dict) else {}
        )
        for name in os.listdir(self.out_dir):  # partials of other jobs, or of shards we must redo
            if name.endswith(PARTIAL) and name[: -len(PARTIAL)] not in done_before:
                os.unlink(os.path.join(self.out_dir, name))
        return [
            s.filename in done_before
            and s.filename in self._sums_before
            and valid_partial(p, s.header, s.file_bytes, self._sums_before[s.filename])
            for s, p in zip(self.plan.shards, self.partials, strict=True)
        ]

    def record(self) -> None:
        """Write the journal: the shards finished so far and their checksums."""
        write_journal(self.out_dir, self.plan, self.completed, self.sums)

    def finished(self, index: int) -> None:
        """Shard `index` is completely written: checksum it (one re-read, from the page cache) and journal it.

        The last shard is not: the renames follow at once and the journal goes with them, so only a kill in
        that instant could want it, and then rewriting it is right. A one-shard output (anything up to
        --shard-size, 5 GB by default) so pays nothing for resumability."""
        if len(self.completed) + 1 == len(self.plan.shards):
            return
        name = self.plan.shards[index].filename
        self.sums[name] = file_crc32(self.partials[index])
        self.completed.append(name)
        self.record()
