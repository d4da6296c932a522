"""What the output root reads below OUT, apart from what changes it (`convert/root.py`, the only code that
changes files): entries, sizes, listings, bookkeeping files and CRC-32s, each reached from the held folder
descriptor one plain name at a time without following a link; and who holds OUT's lock, asked read-only."""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

from inspector.convert.checksum import fd_crc32
from inspector.convert.outnames import LOCK, PART, BusyError, parts_of
from inspector.errors import OutputError
from inspector.text import quoted, shown

if TYPE_CHECKING:
    from inspector.convert.outnames import Destination

CLOEXEC = getattr(os, "O_CLOEXEC", 0)
NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
DIR_FLAGS = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | NOFOLLOW | CLOEXEC


def busy(path: str, holder: str) -> BusyError:
    """The refusal of a second run into a folder whose lock another process holds (`holder`: its pid)."""
    who = f" (process {holder})" if holder.isdigit() else ""
    return BusyError(
        f"Another conversion{who} is writing to {path}.",
        hint="Wait for it to finish, or choose another output folder. Two runs in one folder "
        "would overwrite each other's files.",
    )


def only_name(fd: int) -> bool:
    """A regular file with no name but the one we opened: bookkeeping this tool made, safe to write."""
    st = os.fstat(fd)
    return stat.S_ISREG(st.st_mode) and st.st_nlink == 1


def linked(shown_path: str, part: str) -> OutputError:
    """The refusal to write through `part` of a path below OUT: a link, or not a folder."""
    return OutputError(
        f"Refusing to write {shown_path}: {quoted(part)} inside the output folder is a link or not a folder.",
        hint="Something other than this tool put it there; remove it or choose another output folder.",
        title="Unsafe output folder",
    )


def planted(shown_path: str) -> OutputError:
    """The refusal to write to a bookkeeping name that holds something this tool never makes there."""
    return OutputError(
        f"{shown_path} is not a file this tool made: it is not a regular file, or it has other names (a hard "
        "link), so writing to it could change a file outside the output folder. Nothing was written to it.",
        hint=f"Remove {shown_path} (removing the name leaves any other copy alone), then run again.",
    )


def lock_holder(out_dir: str) -> str | None:
    """Who holds OUT's lock now (its pid as written, or ""), or None when nobody does: read-only, so a folder
    can be refused as busy before its contents are judged (a running job's partial files are not foreign)."""
    import fcntl

    try:
        fd = os.open(os.path.join(out_dir, LOCK), os.O_RDONLY | NOFOLLOW | CLOEXEC)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
        return None if holder == str(os.getpid()) else holder  # this run's own lock, taken meanwhile
    except OSError:
        return None
    finally:
        os.close(fd)
    return None


class ReadsBelow:
    """The reading half of an `OutputRoot`: it holds `fd` (OUT, open), `path` and, for a bucket OUT, the
    `dest` that knows the sizes of published files; `_parent` walks to a file's folder."""

    fd: int
    path: str
    dest: Destination | None
    lock_name: str  # this run's own lock, which `refuse_running` passes over

    def _parent(self, rel: str, create: bool) -> tuple[int, str]:
        raise NotImplementedError

    def show(self, rel: str = "") -> str:
        """The path of `rel` for a message (escaped)."""
        return shown(os.path.join(self.path, rel) if rel else self.path)

    # -- reading what is there --------------------------------------------------------------------------

    def lstat(self, rel: str) -> os.stat_result | None:
        """The entry itself (a link is reported as a link), or None when it is missing."""
        try:
            fd, name = self._parent(rel, create=False)
        except (FileNotFoundError, NotADirectoryError):
            return None
        try:
            return os.stat(name, dir_fd=fd, follow_symlinks=False)
        except FileNotFoundError:
            return None
        finally:
            os.close(fd)

    def is_file(self, rel: str) -> bool:
        st = self.lstat(rel)
        return st is not None and stat.S_ISREG(st.st_mode)

    def size(self, rel: str) -> int:
        return self.sizes([rel])[0]

    def listdir(self, rel: str = "") -> list[str]:
        if not rel:
            return sorted(os.listdir(self.fd))
        fd, name = self._parent(rel, create=False)
        try:
            sub = os.open(name, DIR_FLAGS, dir_fd=fd)
        finally:
            os.close(fd)
        try:
            return sorted(os.listdir(sub))
        finally:
            os.close(sub)

    def in_folders(self, rels: Sequence[str]) -> Iterator[tuple[int, str, int]]:
        """(folder descriptor, name, index) of each of `rels`, each folder walked once for all of its names
        (an export's thousands of files lie in a few hundred folders); the names of a folder that is not
        there are passed over. The descriptor is open until the next step."""
        groups: dict[str, list[int]] = {}
        for i, rel in enumerate(rels):
            groups.setdefault(rel.rpartition("/")[0], []).append(i)
        for idx in groups.values():
            try:
                fd, _ = self._parent(rels[idx[0]], create=False)
            except (FileNotFoundError, NotADirectoryError):
                continue
            try:
                for i in idx:
                    yield fd, parts_of(rels[i])[-1], i
            finally:
                os.close(fd)

    def sizes(self, rels: Sequence[str]) -> list[int]:
        """`size` of each of `rels` (0 for one missing), each folder walked once."""
        out = [self.dest.size_of(rel) if self.dest is not None else None for rel in rels]
        local = [i for i, size in enumerate(out) if size is None]
        for fd, name, j in self.in_folders([rels[i] for i in local]):
            with contextlib.suppress(FileNotFoundError):
                out[local[j]] = os.stat(name, dir_fd=fd, follow_symlinks=False).st_size
        return [size or 0 for size in out]

    def open_read(self, rel: str) -> int:
        """A regular file below OUT for reading (our own journal, a finished file to checksum)."""
        fd, name = self._parent(rel, create=False)
        try:
            f = os.open(name, os.O_RDONLY | os.O_NONBLOCK | NOFOLLOW | CLOEXEC, dir_fd=fd)
        finally:
            os.close(fd)
        if not stat.S_ISREG(os.fstat(f).st_mode):
            os.close(f)
            raise OutputError(f"{self.show(rel)} is not a regular file.", title="Unsafe output folder")
        return f

    def read_small(self, rel: str, limit: int = 64 << 20) -> bytes | None:
        """A bookkeeping file's bytes (at most `limit`), or None when it is missing or not a regular file."""
        try:
            fd = self.open_read(rel)
        except (OSError, OutputError):
            return None
        try:
            return os.pread(fd, limit, 0)
        finally:
            os.close(fd)

    def crc32(self, rel: str) -> int:
        """CRC-32 of a whole file, read in fixed 8 MiB blocks (flat memory; zlib releases the GIL)."""
        fd = self.open_read(rel)
        try:
            return fd_crc32(fd)
        finally:
            os.close(fd)

    def refuse_running(self, part: tuple[int, int] | None, family: str = LOCK) -> None:
        """Parts of one job run side by side, each under a lock of its own (`LOCK.part-i-of-n`); the run
        without a part finishes their folder. Neither may race the other: the finishing run refuses while a
        part holds its lock, a part while a finishing run holds the plain lock. `family`: the plain lock's
        name where it is not LOCK (a bucket output's lock beside its staging folders)."""
        import fcntl

        for name in self.listdir():
            others = name.startswith(family + PART) if part is None else name == family
            if name == self.lock_name or not others:
                continue
            try:
                fd = self.open_read(name)
            except (OSError, OutputError):
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except BlockingIOError:
                who = name[len(family) + 1 :].replace("-", " ") or "a run without --part"
                raise BusyError(
                    f"Another conversion ({who}) is writing into {self.path}.",
                    hint="Parts run side by side; the finishing convert (without --part) runs once every part "
                    "has ended.",
                ) from None
            finally:
                os.close(fd)

    def walk_files(self, rel: str) -> Iterator[str]:
        """Every regular file below the folder `rel`, as paths relative to OUT (links are not entered): each
        folder opened once, from its parent's descriptor, and listed with the entries' own types."""
        fd, _ = self._parent(rel + "/x", create=False)  # `rel` itself, reached as every walk reaches it
        try:
            yield from _files_below(fd, rel)
        finally:
            os.close(fd)


def _files_below(fd: int, rel: str) -> Iterator[str]:
    """The regular files below the open folder `fd` (named `rel`), sorted by name at each level."""
    with os.scandir(fd) as it:
        entries = sorted(it, key=lambda e: e.name)
    for e in entries:
        sub = f"{rel}/{e.name}"
        if e.is_dir(follow_symlinks=False):
            try:
                child = os.open(e.name, DIR_FLAGS, dir_fd=fd)
            except OSError:  # gone, or swapped for a link since the listing: not entered
                continue
            try:
                yield from _files_below(child, sub)
            finally:
                os.close(child)
        elif e.is_file(follow_symlinks=False):
            yield sub
