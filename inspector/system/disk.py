"""Where an output will be created: whether it can be (a read-only file system, a folder this user may not
write to) and how much free space it has, judged at the nearest folder that already exists."""

from __future__ import annotations

import os
import shutil
from pathlib import Path


def _existing(path: str | os.PathLike[str]) -> Path:
    current = Path(os.path.abspath(os.fspath(path)))
    while not current.exists() and current.parent != current:
        current = current.parent
    return current


def unwritable(path: str | os.PathLike[str]) -> str:
    """Why an output cannot be created at `path` ("" when it can): a read-only file system, or a folder
    this user may not write to. Asks the kernel (statvfs, access); creates nothing."""
    where = _existing(path)
    try:
        if os.statvfs(where).f_flag & os.ST_RDONLY:
            return f"{where} is on a read-only file system"
    except OSError:
        return f"{where} cannot be examined"
    folder = where if where.is_dir() else where.parent
    if not os.access(folder, os.W_OK | os.X_OK):
        return f"{folder} is not writable by this user"
    return ""


def free_disk_bytes(path: str | os.PathLike[str]) -> int:
    """Free space (for unprivileged users) where ``path`` will be created.

    The output folder usually does not exist yet, so the nearest existing ancestor decides the filesystem.
    """
    current = Path(os.path.abspath(os.fspath(path)))
    while not current.exists() and current.parent != current:
        current = current.parent
    return shutil.disk_usage(current).free  # f_bavail * f_frsize
