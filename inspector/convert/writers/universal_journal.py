"""What a universal export may trust after a kill, and where it may write: the journal of finished files
(name, size, CRC-32, one JSON line each, appended as files finish) and the one check that builds every path
of the export from plain name components, never through a link."""

from __future__ import annotations

import json
import os
import threading

from inspector.convert.output import file_crc32
from inspector.errors import OutputError
from inspector.parse.names import escaped, name_problem

JOURNAL = ".zero_inspector_journal.jsonl"


def inside(staging: str, rel: str) -> str:
    """`staging/rel`, refused unless every component is a plain name and nothing on the way is a link: a
    file of the export can never land outside the output folder (names were checked at scan; this is the
    writer's own check, so a future reader that forgets cannot open the hole again)."""
    parts = [p for p in rel.split("/") if p]
    for part in parts:
        if name_problem(part):
            raise OutputError(f"Refusing to write {escaped(rel)!r}: {escaped(part)!r} {name_problem(part)}.")
    path = staging
    for part in parts[:-1]:
        path = os.path.join(path, part)
        if os.path.islink(path):
            raise OutputError(f"{path} is a link; refusing to write through it.")
    path = os.path.join(staging, *parts)
    if os.path.islink(path):
        raise OutputError(f"{path} is a link; refusing to write through it.")
    return path


class Journal:
    """Appends one JSON line per finished file (name, size, CRC-32), so a rerun after a kill keeps a file only
    if it still has the bytes it was finished with: a file truncated or changed since is written again."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.lock = threading.Lock()

    def finished(self, rel: str, path: str) -> None:
        line = json.dumps({"file": rel, "size": os.path.getsize(path), "crc32": file_crc32(path)}) + "\n"
        with self.lock:
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o644)
            try:
                os.write(fd, line.encode())
            finally:
                os.close(fd)


def finished_files(staging: str) -> dict[str, tuple[int, int]]:
    """What a previous run of this job journalled as finished: file -> (size, CRC-32); bounded and typed."""
    path = os.path.join(staging, JOURNAL)
    out: dict[str, tuple[int, int]] = {}
    try:
        with open(path, "rb") as fh:
            raw = fh.read(64 << 20)
    except OSError:
        return out
    for line in raw.splitlines():
        try:
            doc = json.loads(line)
        except ValueError:
            continue  # a line cut by the kill
        if isinstance(doc, dict):
            f, size, crc = doc.get("file"), doc.get("size"), doc.get("crc32")
            if isinstance(f, str) and isinstance(size, int) and isinstance(crc, int):
                out[f] = (size, crc)
    return out


def reusable(staging: str, rel: str, finished: dict[str, tuple[int, int]]) -> bool:
    want = finished.get(rel)
    path = os.path.join(staging, rel)
    if want is None or os.path.islink(path) or not os.path.isfile(path):
        return False
    try:
        return os.path.getsize(path) == want[0] and file_crc32(path) == want[1]
    except OSError:
        return False
