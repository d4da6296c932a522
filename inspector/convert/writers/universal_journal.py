"""What a universal export may trust after a kill: the journal of finished files (name, size, CRC-32, one JSON
line each, appended as files finish, inside the staging folder of the OutputRoot)."""

from __future__ import annotations

import json
import threading

from inspector.convert.root import OutputRoot

JOURNAL = ".zero_inspector_journal.jsonl"


class Journal:
    """Appends one JSON line per finished file (name, size, CRC-32), so a rerun after a kill keeps a file only
    if it still has the bytes it was finished with: a file truncated or changed since is written again."""

    def __init__(self, root: OutputRoot, staging: str, suffix: str = "", *, synced: bool = False) -> None:
        self.root = root
        self.staging = staging
        self.name = JOURNAL + suffix  # a part journals under a name of its own; no two writers share a file
        self.lock = threading.Lock()
        self.synced = synced  # files were fsynced before they are journalled: a crash cannot have torn them

    def finished(self, rel: str) -> None:
        if self.root.dest is not None:  # published and gone from the staging folder: the bucket keeps the record
            return
        path = f"{self.staging}/{rel}"
        doc = {"file": rel, "size": self.root.size(path), "crc32": self.root.crc32(path), "synced": self.synced}
        line = json.dumps(doc) + "\n"
        with self.lock:
            self.root.append(f"{self.staging}/{self.name}", line.encode())

    def previous(self) -> dict[str, tuple[int, int, bool]]:
        """What earlier runs of this job journalled as finished: file -> (size, CRC-32, synced); bounded and
        typed. The finishing run (no suffix) reads every part's journal too."""
        out: dict[str, tuple[int, int, bool]] = {}
        names = [self.name]
        if self.name == JOURNAL:
            names += [n for n in self.root.listdir(self.staging) if n.startswith(JOURNAL + ".part-")]
        raw = b"\n".join(self.root.read_small(f"{self.staging}/{n}") or b"" for n in names)
        for line in raw.splitlines():
            try:
                doc = json.loads(line)
            except ValueError:
                continue  # a line cut by the kill
            if isinstance(doc, dict):
                f, size, crc, synced = doc.get("file"), doc.get("size"), doc.get("crc32"), doc.get("synced")
                if isinstance(f, str) and isinstance(size, int) and isinstance(crc, int):
                    out[f] = (size, crc, synced is True)
        return out

    def reusable(self, rel: str, finished: dict[str, tuple[int, int, bool]]) -> bool:
        """A regular file (not a link) that still has the size and CRC-32 it was finished with; a file that
        was on disk before it was journalled (`--fsync`) is checked by its size alone, not read back."""
        want = finished.get(rel)
        path = f"{self.staging}/{rel}"
        if want is None or not self.root.is_file(path):
            return False
        try:
            return self.root.size(path) == want[0] and (want[2] or self.root.crc32(path) == want[1])
        except OSError:
            return False
