"""The folder descriptors a `Source` keeps, so the rank files of one folder cost one `openat` each.

Without them every file open walked from the root again (an `openat` per component): at 1,024 ranks that
was two of every rank file's three opens. A folder is still reached only by that walk, link-free
(`Source._walk_dirs`); what is kept is the descriptor it ended on, so a file is then opened relative to a
folder that was inside the root when walked. A folder moved elsewhere afterwards keeps the content it had
(whoever moved it could write that content anyway), and every file is still opened with `O_NOFOLLOW` after an
lstat, so a link put into it is refused as before.

Kept only while someone reads a batch of files (`keeping`: the scan's `files.load_all`), so a source held
for long (the app's checkpoint) holds no folder open, which would keep its disk from being unmounted and
show a folder replaced on disk as it was; outside a batch every open walks and closes as before. Bounded: a
few folders (least recently used closed first), all closed when the batch ends (or the source is
collected); a listing walks its folder afresh. Descriptors are `O_CLOEXEC` (never inherited by a program run),
a forked child drops what it inherited, and a copy or pickle of a source starts empty.
"""

from __future__ import annotations

import contextlib
import os
import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable, Iterator

KEPT = 4  # folders per source: a scan reads one tag folder (and the root's small files)

_live: weakref.WeakSet[DirCache] = weakref.WeakSet()


class DirCache:
    """Folder descriptors by their components below the root. The lock is held while a kept descriptor is
    used, so no other thread closes it (and the number names another folder) between lookup and use."""

    def __init__(self) -> None:
        self._fds: OrderedDict[tuple[str, ...], int] = OrderedDict()
        self._lock = threading.Lock()
        self._batches = 0  # `keeping` blocks open: descriptors are kept only while one is
        self._done = weakref.finalize(self, _close_all, self._fds)
        _live.add(self)

    def __reduce__(self) -> tuple[type[DirCache], tuple[()]]:
        return (DirCache, ())  # a descriptor is this process's: a copy starts empty

    def __deepcopy__(self, memo: dict[int, object]) -> DirCache:
        return DirCache()

    @contextlib.contextmanager
    def keeping(self) -> Iterator[None]:
        """Keep the folders walked during the block (nested and concurrent blocks share them), then close."""
        with self._lock:
            self._batches += 1
        try:
            yield
        finally:
            with self._lock:
                self._batches -= 1
                if self._batches == 0:
                    _close_all(self._fds)

    @contextlib.contextmanager
    def held(self, parts: list[str], walk: Callable[[], int], *, fresh: bool = False) -> Iterator[int]:
        """The folder's descriptor for the block: the kept one, or `walk()`'s (then kept within a batch, else
        closed after). `fresh`: walk anyway (a listing sees the folder as it is now)."""
        key = tuple(parts)
        with self._lock:
            fd = None if fresh else self._fds.get(key)
            if fd is None and not self._batches:
                fd = walk()
                try:
                    yield fd
                finally:
                    os.close(fd)
                return
            if fd is None:
                fd = walk()
                old = self._fds.pop(key, None)
                if old is not None:
                    os.close(old)
                self._fds[key] = fd
                while len(self._fds) > KEPT:
                    os.close(self._fds.popitem(last=False)[1])
            else:
                self._fds.move_to_end(key)
            yield fd

    def _forked(self) -> None:
        """In a forked child: the lock may have been held by a thread that does not exist here."""
        self._lock = threading.Lock()
        self._batches = 0
        _close_all(self._fds)

    def __len__(self) -> int:
        return len(self._fds)


def _close_all(fds: OrderedDict[tuple[str, ...], int]) -> None:
    while fds:
        with contextlib.suppress(OSError):
            os.close(fds.popitem()[1])


def _after_fork() -> None:
    for cache in list(_live):
        cache._forked()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork)
