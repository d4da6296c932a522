"""The one output boundary: every file the tool creates, renames, copies or removes goes through an OutputRoot.

An OutputRoot is the output folder the user named, created if needed, locked for the run (`flock`, dropped by
the kernel if the process dies) and held open as a descriptor. Every path below it is given as a relative path
of plain name components (the input boundary's name rule: no `..`, no separators, no control characters) and is
reached from that descriptor one component at a time with `O_NOFOLLOW`, so a link planted inside OUT, or
swapped in during the run, is refused rather than followed: no write can leave OUT. Writers get the root, never
a path string; they know names inside it only. The folder the user typed may itself be reached through links
(their choice); nothing below it is.

When OUT is a bucket the root is the run's staging folder and holds a `Destination` (`remote.upload`): the
moment a file is put in place under its final name (`replace`, so also `write_with`, `write_atomic`,
`copy_in`), it is uploaded under that name and its staged copy removed; bookkeeping (locks, journals, partial
and temporary files) stays local. Writers do not change: the name rule above is also what keeps every key
inside the bucket prefix.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections.abc import Callable
from typing import BinaryIO

from inspector.convert.checksum import fd_crc32
from inspector.convert.outnames import (
    LOCK,
    PART,
    PARTIAL,
    PROBE,
    BusyError,
    Destination,
    local_only,
    missing_dirs,
    parts_of,
)
from inspector.convert.rootread import (
    CLOEXEC,
    DIR_FLAGS,
    NOFOLLOW,
    ReadsBelow,
    busy,
    linked,
    lock_holder,
    only_name,
    planted,
)
from inspector.errors import OutputError
from inspector.system.bytesource import ByteSource

__all__ = [
    "LOCK",
    "PART",
    "PARTIAL",
    "BusyError",
    "Destination",
    "OutputRoot",
    "busy",
    "fd_crc32",
    "local_only",
    "lock_holder",
    "missing_dirs",
    "refuses_new_entries",
    "remove_empty_dirs",
]


def remove_empty_dirs(paths: list[str]) -> None:
    """Remove folders a failed run created (`missing_dirs`, deepest first), stopping at the first that is not
    empty: what someone else put there is never removed."""
    for path in paths:
        try:
            os.rmdir(path)
        except OSError:
            break


def refuses_new_entries(path: str) -> str:
    """Why the nearest existing folder of `path` takes no new entry ("" when it does), found by making and
    removing an empty folder there: root passes every mode check, and pseudo file systems (/sys, /proc)
    refuse what their modes allow, so only trying tells (preflight's `output_writable`)."""
    import tempfile

    folder = os.path.abspath(path)
    while not os.path.exists(folder) and os.path.dirname(folder) != folder:
        folder = os.path.dirname(folder)
    if not os.path.isdir(folder):
        folder = os.path.dirname(folder)
    try:
        os.rmdir(tempfile.mkdtemp(prefix=PROBE, dir=folder))
    except OSError as exc:
        return f"{folder} does not accept new files ({exc.strerror or exc})"
    return ""


class OutputRoot(ReadsBelow):
    """One run's output folder: created, locked, held open; the only code that changes files in it."""

    def __init__(
        self, path: str, *, lock: bool = True, lock_name: str = LOCK, dest: Destination | None = None
    ) -> None:
        self.path = os.path.abspath(path)
        self.dest = dest  # OUT is elsewhere (a bucket): this folder stages files until they are published
        self.created = missing_dirs(self.path)
        try:
            os.makedirs(self.path, exist_ok=True)
            self.fd = os.open(self.path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | CLOEXEC)
        except OSError as exc:
            raise OutputError(
                f"Cannot create the output folder {self.path}: {exc.strerror}.",
                hint="Choose a folder you can write to.",
            ) from None
        self._lock = -1
        self.lock_name = lock_name
        if lock:
            try:
                self._lock = self._take_lock()
            except BaseException:
                os.close(self.fd)
                self.created = []  # the folder may hold another run's files now; never remove it
                raise

    # -- the lock ---------------------------------------------------------------------------------------

    def _take_lock(self) -> int:
        """An exclusive `flock` on OUT/.zero-inspector.lock; a second run into OUT is refused at once. The file
        is unlinked on release, so after locking we check the name still leads to the inode we hold."""
        import fcntl

        for _ in range(5):
            try:
                fd = _open_own(self.lock_name, os.O_RDWR, self.fd)
            except FileExistsError:  # another run made it between our two opens: look again
                continue
            except OSError as exc:
                raise OutputError(f"Cannot create the lock file in {self.path}: {exc.strerror}.") from None
            if not only_name(fd):
                os.close(fd)
                raise planted(self.show(self.lock_name))
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
                os.close(fd)
                raise busy(self.path, holder) from None
            except OSError as exc:
                os.close(fd)
                raise OutputError(
                    f"Cannot lock {self.path}: {exc.strerror}.",
                    hint="The file system does not support locks; choose an output folder on a local disk.",
                ) from None
            try:
                st = os.stat(self.lock_name, dir_fd=self.fd, follow_symlinks=False)
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
        raise BusyError(f"Could not lock {self.path}: the lock file keeps changing.")

    def release(self, ok: bool) -> None:
        """Unlock and close; after a failure also remove the folders this run created, if they are empty."""
        if self._lock >= 0:
            with contextlib.suppress(OSError):
                os.unlink(self.lock_name, dir_fd=self.fd)
            os.close(self._lock)
            self._lock = -1
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
        if not ok:
            remove_empty_dirs(self.created)
        self.created = []

    def __enter__(self) -> OutputRoot:
        return self

    def __exit__(self, exc_type: object, *_: object) -> None:
        self.release(ok=exc_type is None)

    # -- walking ----------------------------------------------------------------------------------------

    def _parent(self, rel: str, create: bool) -> tuple[int, str]:
        """A descriptor of `rel`'s folder (the caller closes it) and its last name; folders on the way are
        opened with O_NOFOLLOW (a link is refused) and, with `create`, made when missing."""
        parts = parts_of(rel)
        fd = os.dup(self.fd)
        try:
            for p in parts[:-1]:
                try:
                    nxt = os.open(p, DIR_FLAGS, dir_fd=fd)
                except FileNotFoundError:
                    if not create:
                        raise
                    with contextlib.suppress(FileExistsError):
                        os.mkdir(p, 0o755, dir_fd=fd)
                    nxt = os.open(p, DIR_FLAGS, dir_fd=fd)
                except OSError as exc:
                    if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                        raise linked(self.show(rel), p) from None
                    raise
                os.close(fd)
                fd = nxt
        except BaseException:
            os.close(fd)
            raise
        return fd, parts[-1]

    # -- changing it ------------------------------------------------------------------------------------

    def mkdirs(self, rel: str) -> None:
        fd, _ = self._parent(rel + "/x", create=True)  # every component of rel, made when missing
        os.close(fd)

    def create(self, rel: str) -> int:
        """A new, empty regular file at `rel`, open for writing (folders on the way made): one already there is
        unlinked and a new inode made, never truncated in place, so a planted hard link is never written through."""
        fd, name = self._parent(rel, create=True)
        try:
            return self._new(rel, name, fd)
        finally:
            os.close(fd)

    def _new(self, rel: str, name: str, dir_fd: int, own: int = 0) -> int:
        """`_fresh`, or with `own` flags `_open_own`; a link at `name` is refused in the root's words."""
        try:
            return _open_own(name, own, dir_fd) if own else _fresh(name, dir_fd)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise linked(self.show(rel), name) from None
            if exc.errno == errno.ENXIO:  # a FIFO (or socket) with no reader: never ours
                raise planted(self.show(rel)) from None
            raise

    def append(self, rel: str, data: bytes) -> None:
        """Append to a bookkeeping file (a journal line), made exclusively when missing; one that is not a
        regular file of one name (a FIFO, a planted hard link) is refused before a byte is written."""
        fd, name = self._parent(rel, create=True)
        try:
            f = self._new(rel, name, fd, os.O_WRONLY | os.O_APPEND)
        finally:
            os.close(fd)
        if not only_name(f):
            os.close(f)
            raise planted(self.show(rel))
        try:
            os.write(f, data)
        finally:
            os.close(f)

    def write_with(self, rel: str, fill: Callable[[BinaryIO], object], *, fsync: bool = False) -> int:
        """`rel` as `fill(file)` writes it, in place all at once: written beside it as `rel.tmp`, renamed when
        complete, removed if `fill` fails or is cancelled. Returns the file's size. The folder is walked once
        for the three (three walks were most of a small file's system calls) and held as `create` holds it."""
        pfd, name = self._parent(rel, create=True)
        try:
            fd = self._new(rel + ".tmp", tmp := name + ".tmp", pfd)
            try:
                with os.fdopen(fd, "wb", buffering=BUFFER) as fh:
                    fill(fh)
                    fh.flush()
                    if fsync:
                        os.fsync(fh.fileno())
                    size = fh.tell()
            except BaseException:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(tmp, dir_fd=pfd)
                raise
            if self.dest is None or local_only(rel):
                os.replace(tmp, name, src_dir_fd=pfd, dst_dir_fd=pfd)
                return size
        finally:
            os.close(pfd)
        self._publish(rel + ".tmp", rel)
        return size

    def write_atomic(self, rel: str, data: bytes, *, fsync: bool = False) -> int:
        """`rel` holding exactly `data`, in place all at once."""
        return self.write_with(rel, lambda fh: fh.write(data), fsync=fsync)

    def copy_in(self, source: ByteSource, path: str, rel: str, *, fsync: bool = False) -> int:
        """A regular file from inside `source` (a folder or a bucket prefix: the input boundary refuses a link
        out of it, a FIFO, a device), byte for byte, to `rel`, in place all at once; returns its size."""
        src = source.open_handle(path)

        def fill(fout: BinaryIO) -> None:
            view = memoryview(bytearray(1 << 20))
            offset = 0
            while n := src.read_into(offset, view):
                fout.write(view[:n])
                offset += n

        try:
            return self.write_with(rel, fill, fsync=fsync)
        finally:
            src.close()

    def replace(self, src: str, dst: str) -> None:
        """Rename `src` to `dst` inside OUT (atomic; replaces a file at `dst`, never follows a link there).
        With a destination, an output file is published there instead and its staged copy removed."""
        if self.dest is not None and not local_only(dst):
            self._publish(src, dst)
            return
        sfd, sname = self._parent(src, create=False)
        try:
            dfd, dname = self._parent(dst, create=True)
            try:
                os.replace(sname, dname, src_dir_fd=sfd, dst_dir_fd=dfd)
            finally:
                os.close(dfd)
        finally:
            os.close(sfd)

    def _publish(self, src: str, dst: str) -> None:
        parts_of(dst)  # the name rule, before a byte leaves
        assert self.dest is not None
        fd = self.open_read(src)
        try:
            self.dest.publish(fd, os.fstat(fd).st_size, fd_crc32(fd), dst)
        finally:
            os.close(fd)
        self.remove(src)

    def remove(self, rel: str) -> bool:
        """Remove a file (or a link: the link, never its target); False when it was not there."""
        return self.remove_all([rel]) == 1

    def remove_all(self, rels: list[str]) -> int:
        """`remove` each of `rels`, each folder walked once (a resumed export clears thousands of names);
        how many were there."""
        gone = 0
        for fd, name, _ in self.in_folders(rels):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(name, dir_fd=fd)
                gone += 1
        return gone

    def remove_tree(self, rel: str) -> None:
        """Remove a folder below OUT and everything in it, following no link (a link is removed as a link)."""
        try:
            fd, name = self._parent(rel, create=False)
        except (FileNotFoundError, NotADirectoryError):
            return
        try:
            _rmtree_at(fd, name)
        except FileNotFoundError:  # nothing there: nothing to remove
            pass
        finally:
            os.close(fd)

    def fsync_dir(self) -> None:
        with contextlib.suppress(OSError):
            os.fsync(self.fd)


BUFFER = 1 << 16  # a file object's buffer, given so that opening one asks no terminal question (isatty)
_NEW = os.O_CREAT | os.O_EXCL | NOFOLLOW | CLOEXEC


def _open_own(name: str, flags: int, dir_fd: int) -> int:
    """`name` opened with `flags` if there (no link followed, no FIFO waited on), else made new, exclusively."""
    try:
        return os.open(name, flags | os.O_NONBLOCK | NOFOLLOW | CLOEXEC, dir_fd=dir_fd)
    except FileNotFoundError:
        return os.open(name, flags | _NEW, 0o644, dir_fd=dir_fd)


def _fresh(name: str, dir_fd: int) -> int:
    """A new inode under `name`, open for writing: a file there is unlinked (the name only) and never truncated
    in place, where a planted hard link would be written through; a link there is refused (ELOOP). The
    exclusive create comes first: the name is almost always free (one call, not three)."""
    for _ in range(5):
        with contextlib.suppress(FileExistsError):
            return os.open(name, _NEW | os.O_RDWR, 0o644, dir_fd=dir_fd)
        with contextlib.suppress(FileNotFoundError):  # gone again before the look: the next create takes it
            if stat.S_ISLNK(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode):
                raise OSError(errno.ELOOP, os.strerror(errno.ELOOP))
            os.unlink(name, dir_fd=dir_fd)
    raise OSError(errno.EEXIST, os.strerror(errno.EEXIST))


def _rmtree_at(parent: int, name: str) -> None:
    st = os.stat(name, dir_fd=parent, follow_symlinks=False)
    if not stat.S_ISDIR(st.st_mode):
        os.unlink(name, dir_fd=parent)
        return
    fd = os.open(name, DIR_FLAGS, dir_fd=parent)
    try:
        for child in os.listdir(fd):
            _rmtree_at(fd, child)
    finally:
        os.close(fd)
    os.rmdir(name, dir_fd=parent)
