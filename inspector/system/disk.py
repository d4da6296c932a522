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


GENERIC_NAMES = {"checkpoint", "checkpoints", "ckpt", "ckpts", "output", "outputs"}


def proposed_out(root: str, tag: str) -> str:
    """Where an export goes when none is named (the app's form, `preflight` without OUT): `<name>-<tag>-
    safetensors` beside the checkpoint folder, or in the user's home when that folder cannot take a new entry
    (read-only, another user's, a bucket); never the current folder, which may be a git clone. A generic folder
    name (`checkpoint`, `ckpt`) is prefixed with its parent's, so two runs do not propose the same folder."""
    parts = root.rstrip(os.sep).split(os.sep)
    base = parts[-1] or "checkpoint"
    remote = "://" in root
    if base.lower() in GENERIC_NAMES and len(parts) > 1 and parts[-2] and not remote:
        base = f"{parts[-2]}-{base}"
    beside = os.path.dirname(os.path.abspath(root.rstrip(os.sep) or os.sep))
    where = (
        beside if not remote and os.path.isdir(beside) and not unwritable(beside) else os.path.expanduser("~")
    )
    return os.path.join(where, f"{base}-{tag}-safetensors")
