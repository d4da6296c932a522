"""The one way the tool opens a file it reads: confined to a root folder, regular files only, content unshown.

Everything the tool reads (rank files, `latest`, universal inputs, Trainer side files, a base model, the output
`verify` checks) lives under some folder the user named. A `Source` is that folder. It refuses a path that
leaves it (`..`, an absolute path elsewhere, or a link whose target lies outside), refuses anything that is not
a regular file *before* opening it (a FIFO would block, a device could act), and opens the file by walking
from the root one component at a time with `O_NOFOLLOW`, so a link swapped in after the check is refused too.
Its messages name the path, escaped, and never the file's content or a link's target.
"""

from __future__ import annotations

import json
import os
import stat
from contextlib import AbstractContextManager as _Held
from dataclasses import dataclass, field
from typing import Any

from inspector.errors import CorruptFileError, InspectorError
from inspector.system.dirfds import DirCache
from inspector.text import shown

_KINDS = (
    (stat.S_ISDIR, "a folder"),
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISLNK, "a symbolic link"),
)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_DIR_FLAGS = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | _NOFOLLOW | _CLOEXEC
_FILE_FLAGS = os.O_RDONLY | os.O_NONBLOCK | _NOFOLLOW | _CLOEXEC | getattr(os, "O_NOCTTY", 0)


def file_kind(mode: int) -> str:
    """What a non-regular file is, in words."""
    return next((words for test, words in _KINDS if test(mode)), "not a regular file")


def os_error(path: str, exc: OSError) -> CorruptFileError:
    """Any OS error on a source file, as a finding-ready error that names the file (never its content)."""
    p = shown(path)
    if isinstance(exc, FileNotFoundError):
        return CorruptFileError(f"{p}: file not found.", title="Missing file")
    if isinstance(exc, PermissionError):
        return CorruptFileError(
            f"{p}: permission denied.",
            hint="Check the file's permissions; we only need read access.",
            title="Unreadable file",
        )
    return CorruptFileError(
        f"{p}: cannot be read ({exc.strerror or type(exc).__name__}).",
        hint="The disk or file system reported an error; check the file.",
        title="Unreadable file",
    )


def not_regular(path: str, mode: int) -> CorruptFileError:
    return CorruptFileError(
        f"{shown(path)}: is {file_kind(mode)}, not a regular file; it was not read.",
        hint="Replace it with the real file.",
        title="Not a file",
    )


def outside(path: str, root: str, label: str = "folder") -> CorruptFileError:
    return CorruptFileError(
        f"{shown(path)} leads outside the {label} {shown(root)} (a link or `..`); it was not read.",
        hint="Copy the real file into the folder instead of linking to it.",
        title="Unsafe link",
    )


def resolves(source: Any, path: str | os.PathLike[str]) -> bool:
    """Whether `source.resolve(path)` answers without an error: `contains` for every byte source."""
    try:
        source.resolve(path)
    except InspectorError:
        return False
    return True


@dataclass(frozen=True)
class Source:
    """A folder the tool reads from: its resolved path, and while a batch of reads runs the descriptors of a
    few folders below it (`dirfds`; a copy or pickle starts without them: it crosses threads, processes)."""

    root: str
    label: str = field(default="folder", compare=False)  # what the folder is, for messages: "checkpoint"
    _dirs: DirCache = field(default_factory=DirCache, init=False, repr=False, compare=False)

    @classmethod
    def at(cls, folder: str | os.PathLike[str], label: str = "folder") -> Source:
        """The folder itself, links resolved once here: the user chose it, so where it points is trusted."""
        real = os.path.realpath(os.path.expanduser(os.fspath(folder)))
        return cls(real, label)

    # -- paths --------------------------------------------------------------------------------------------

    def resolve(self, path: str | os.PathLike[str]) -> str:
        """`path` (absolute, or relative to the root) with every link resolved, if it stays inside the root;
        otherwise a refusal that names the path and not where it leads."""
        raw = os.fspath(path)
        full = raw if os.path.isabs(raw) else os.path.join(self.root, raw)
        real = os.path.realpath(full)
        if not self.holds(real):
            raise outside(full, self.root, self.label)
        return real

    def holds(self, real: str) -> bool:
        """Whether an already-resolved path is the root or lies below it."""
        return real == self.root or real.startswith(self.root.rstrip(os.sep) + os.sep)

    def contains(self, path: str | os.PathLike[str]) -> bool:
        """Whether `path`, links resolved, stays inside the root (no error); an object-store URL never does
        (it would read as a relative path `s3:/…` below the root)."""
        return "://" not in os.fspath(path) and resolves(self, path)

    def _parts(self, real: str) -> list[str]:
        rel = os.path.relpath(real, self.root)
        return [] if rel == "." else rel.split(os.sep)

    def _walk_dirs(self, parts: list[str], shown_path: str, linked: type[Exception] | None = None) -> int:
        """A new descriptor of the folder `parts` below the root, reached without following any link (one
        met: `linked` raised when given, else refused as leading out); the caller keeps or closes it."""
        fd = os.open(self.root, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | _CLOEXEC)
        try:
            for part in parts:
                try:
                    nxt = os.open(part, _DIR_FLAGS, dir_fd=fd)
                except OSError as exc:
                    if exc.errno in (40, 20):  # ELOOP / ENOTDIR: a link or a file where a folder was
                        if linked is not None:
                            raise linked() from None
                        raise outside(shown_path, self.root, self.label) from None
                    raise
                os.close(fd)
                fd = nxt
        except BaseException:
            os.close(fd)
            raise
        return fd

    def _dir_fd(self, parts: list[str], path: str, linked: Any = None, fresh: bool = False) -> _Held[int]:
        """The folder's descriptor for a block; within a batch (`keeping`) kept for the next file in it."""
        return self._dirs.held(parts, lambda: self._walk_dirs(parts, path, linked), fresh=fresh)

    def keeping(self) -> _Held[None]:
        """A batch of reads: the folders walked are kept open till it ends (`dirfds`), one `openat` a file."""
        return self._dirs.keeping()

    # -- files ---------------------------------------------------------------------------------------------

    def open(self, path: str | os.PathLike[str]) -> int:
        """A read-only descriptor of a regular file inside the root; the caller closes it."""
        return self._open(path)[0]

    def open_handle(self, path: str | os.PathLike[str]) -> LocalHandle:
        """The file opened as by `open`, as a handle with its size and positioned reads."""
        fd, st = self._open(path)
        return LocalHandle(os.fspath(path), fd, st.st_size, st.st_mtime_ns)

    def _open(self, path: str | os.PathLike[str]) -> tuple[int, os.stat_result]:
        """(descriptor, its fstat). A path plainly below the root (no `.`, `..` or empty part) is walked as it
        is written, since the walk refuses every link on it; only a path with a link on the way is resolved
        first (a link inside the root to a file inside it is read; one leading out is refused)."""
        full = os.fspath(path)
        parts = self._plain_parts(full)
        if parts:
            try:
                return self._walk(parts, full, lexical=True)
            except _Linked:
                pass
        real = self.resolve(full)
        parts = self._parts(real)
        if not parts:
            raise not_regular(full, stat.S_IFDIR)
        return self._walk(parts, full, lexical=False)

    def _plain_parts(self, full: str) -> list[str] | None:
        """The components of `full` below the root when it is written plainly there, else None."""
        if not os.path.isabs(full):
            full = os.path.join(self.root, full)
        prefix = self.root.rstrip(os.sep) + os.sep
        if not full.startswith(prefix):
            return None
        parts = full[len(prefix) :].split(os.sep)
        return None if any(p in ("", ".", "..") for p in parts) else parts

    def _walk(self, parts: list[str], full: str, *, lexical: bool) -> tuple[int, os.stat_result]:
        """Open root/parts without following any link: a link met is `_Linked` on a `lexical` walk (the
        caller resolves the path), else refused as leading out (it was swapped in since the resolve)."""
        try:
            with self._dir_fd(parts[:-1], full, _Linked if lexical else None) as dfd:
                mode = os.stat(parts[-1], dir_fd=dfd, follow_symlinks=False).st_mode
                if stat.S_ISLNK(mode):
                    raise _Linked() if lexical else outside(full, self.root, self.label)
                if not stat.S_ISREG(mode):  # before opening: a FIFO would block, a device may act
                    raise not_regular(full, mode)
                fd = os.open(parts[-1], _FILE_FLAGS, dir_fd=dfd)
        except OSError as exc:
            if exc.errno == 40:  # ELOOP from O_NOFOLLOW
                raise _Linked() if lexical else outside(full, self.root, self.label) from None
            raise os_error(full, exc) from None
        try:
            st = os.fstat(fd)
        except OSError as exc:
            os.close(fd)
            raise os_error(full, exc) from None
        if not stat.S_ISREG(st.st_mode):
            os.close(fd)
            raise not_regular(full, st.st_mode)
        return fd, st

    def read_bytes(self, path: str | os.PathLike[str], limit: int, what: str = "file") -> bytes:
        """A whole small file (a `latest`, a JSON config), refused if larger than `limit` bytes."""
        full = os.fspath(path)
        fd = self.open(full)
        try:
            data = os.pread(fd, limit + 1, 0)
        except OSError as exc:
            raise os_error(full, exc) from None
        finally:
            os.close(fd)
        if len(data) > limit:
            raise CorruptFileError(
                f"{shown(full)}: too large for a {what} (over {limit:,} bytes); it was not read.",
                hint="Replace it with the real file.",
            )
        return data

    def read_json(self, path: str | os.PathLike[str], limit: int, what: str = "JSON file") -> Any:
        """A small JSON document, parsed; a parse error names the file and the position, never the text."""
        full = os.fspath(path)
        return parse_json(self.read_bytes(full, limit, what), full, what)

    # -- folders -------------------------------------------------------------------------------------------

    def lstat(self, path: str | os.PathLike[str]) -> os.stat_result | None:
        """The entry itself (a link is not followed), or None if it does not exist or leads outside."""
        full = os.fspath(path)
        full = full if os.path.isabs(full) else os.path.join(self.root, full)
        try:
            parent = self.resolve(os.path.dirname(full))
            return os.stat(os.path.join(parent, os.path.basename(full)), follow_symlinks=False)
        except (OSError, InspectorError):
            return None

    def kind(self, path: str | os.PathLike[str]) -> str:
        """"file", "dir", "outside" (a link out of the root), "other" (FIFO, socket, device) or "missing"."""
        full = os.fspath(path)
        try:
            real = self.resolve(full)
        except InspectorError:
            return "outside"
        try:
            mode = os.stat(real).st_mode
        except OSError:
            return "missing"
        if stat.S_ISREG(mode):
            return "file"
        return "dir" if stat.S_ISDIR(mode) else "other"

    def is_file(self, path: str | os.PathLike[str]) -> bool:
        return self.kind(path) == "file"

    def is_dir(self, path: str | os.PathLike[str]) -> bool:
        return self.kind(path) == "dir"

    def listdir(self, path: str | os.PathLike[str] = ".") -> list[str]:
        """Names in a folder inside the root, sorted; the folder is reached without following links."""
        full = os.fspath(path)
        real = self.resolve(full)
        try:
            with self._dir_fd(self._parts(real), full, fresh=True) as dfd:  # the folder as it is now
                return sorted(os.listdir(dfd))
        except OSError as exc:
            raise os_error(full, exc) from None

    # -- what it is, and the locating logic's tree questions --------------------------------------------
    # Exactly the os calls the locating logic always made: links followed (a tag folder may be a link a user
    # made; `locate` checks a tag's real path itself) and not confined to the root (it looks at a root's
    # parent). Every file is still opened through `open`, which refuses a link out of the root.

    @property
    def remote(self) -> bool:
        return False

    def rooted(self, root: str, label: str = "folder") -> Source:
        return Source.at(root, label)

    def absolute(self, path: str) -> str:
        return os.path.abspath(os.path.expanduser(path))

    def _full(self, path: str | os.PathLike[str]) -> str:
        raw = os.fspath(path)
        return raw if os.path.isabs(raw) else os.path.join(self.root, raw)

    def entry(self, path: str) -> str:
        try:
            mode = os.stat(self._full(path)).st_mode
        except (OSError, ValueError):
            return "missing"
        if stat.S_ISREG(mode):
            return "file"
        return "dir" if stat.S_ISDIR(mode) else "other"

    def lexists(self, path: str) -> bool:
        return os.path.lexists(self._full(path))

    def names_in(self, path: str) -> list[str]:
        return os.listdir(self._full(path))

    def subdirs(self, path: str) -> list[str]:
        return [e.name for e in os.scandir(self._full(path)) if e.is_dir()]

    def size_and_mtime(self, path: str) -> tuple[int, int]:
        st = os.stat(self._full(path))
        return st.st_size, st.st_mtime_ns


class _Linked(Exception):
    """A link on a path walked as written: the path is resolved and walked again."""


class LocalHandle:
    """A descriptor opened by `Source.open`, as a byte-source handle: pread, never mapped (RSS stays honest)."""

    def __init__(self, path: str, fd: int, size: int | None = None, mtime_ns: int = 0) -> None:
        self.path, self.fd = path, fd
        self.size, self.mtime_ns = size or 0, mtime_ns  # the opener's own fstat: the file as it was read
        if size is not None:
            return
        try:
            st = os.fstat(fd)
            self.size, self.mtime_ns = st.st_size, st.st_mtime_ns
        except OSError as exc:
            os.close(fd)
            raise os_error(path, exc) from None

    def pread(self, n: int, offset: int) -> bytes:
        try:
            return os.pread(self.fd, n, offset)
        except OSError as exc:
            raise os_error(self.path, exc) from None

    def read_into(self, offset: int, view: memoryview) -> int:
        done, total = 0, len(view)
        while done < total:
            try:
                n = os.preadv(self.fd, [view[done:]], offset + done)
            except OSError as exc:
                raise CorruptFileError(
                    f"{shown(self.path)}: read failed at byte {offset + done} ({exc.strerror}).",
                    hint="The disk or file system reported an error.",
                ) from None
            if n == 0:
                break
            done += n
        return done

    def fileno(self) -> int | None:
        return self.fd

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def open_in(path: str, sources: tuple[Source, ...] = ()) -> int:
    """Open `path` through whichever of `sources` holds it. With none given, the file's own folder is the
    root: right for a file the user named directly, and it still refuses the file being a link or a FIFO."""
    if not sources:
        return Source.at(os.path.dirname(os.path.abspath(path))).open(os.path.abspath(path))
    for src in sources:
        if src.contains(path):
            return src.open(path)
    raise outside(path, sources[0].root, sources[0].label)


def parse_json(raw: bytes, full: str, what: str) -> Any:
    """Bytes read through a source, as JSON; an error names the file and the position, never the text."""
    try:
        return json.loads(raw.decode("utf-8"), parse_constant=_no_constant)
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        where = f" at line {exc.lineno}, column {exc.colno}" if isinstance(exc, json.JSONDecodeError) else ""
        raise CorruptFileError(
            f"{shown(full)}: not readable JSON{where}, so not a valid {what}.",
            hint="Fix or replace the file.",
        ) from None


def _no_constant(name: str) -> Any:
    """JSON's NaN / Infinity are not JSON: refuse them rather than let them reach arithmetic."""
    raise ValueError(f"non-standard constant {name}")
