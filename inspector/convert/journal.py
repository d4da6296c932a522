"""The one journal of a run: which files are finished, with what size and CRC-32, so a rerun after a kill
reuses only files that still hold the bytes they were finished with.

It lives inside the OutputRoot, at its top, as `JOURNAL` (a `--part I/N` run's as `JOURNAL.part-I-of-N`, so no
two writers share a file): a first line naming the job (`Job.identity`), then one JSON line per finished file,
appended as files finish (a kill cuts at most the last line, which is skipped). The finishing run reads every
part's journal of the same job too; the executor removes them all once the output is published.
"""

from __future__ import annotations

import json
import os
import threading

from inspector.convert.root import PART, OutputRoot
from inspector.errors import InspectorError
from inspector.system.source import open_in

JOURNAL = ".zero-inspector-journal.jsonl"
_LIMIT = 64 << 20
Entry = tuple[int, int, bool]  # size, CRC-32, fsynced before it was journalled


class Journal:
    """This run's journal (`suffix`: a part's), and what earlier runs of the same job journalled."""

    def __init__(self, root: OutputRoot, job: str, suffix: str = "", *, synced: bool = False) -> None:
        self.root = root
        self.job = job
        self.name = JOURNAL + suffix
        self.synced = (
            synced  # files reach the disk before they are journalled (--fsync): a crash cannot tear them
        )
        self.lock = threading.Lock()

    def names(self) -> list[str]:
        """Every journal in the root (this run's, every part's, another job's)."""
        return [n for n in self.root.listdir() if n.startswith(JOURNAL) and not n.endswith(".tmp")]

    def jobs(self) -> set[str]:
        """The jobs the journals in the root were written for."""
        return {job for n in self.names() if (job := _job(self.root.read_small(n, _LIMIT))) is not None}

    def previous(self, finishing: bool) -> dict[str, Entry]:
        """What earlier runs of this job journalled as finished, by file name; bounded and typed. The
        finishing run (`finishing`) reads every part's journal too."""
        names = [
            n for n in self.names() if n == self.name or (finishing and n.startswith(JOURNAL + PART))
        ]
        out: dict[str, Entry] = {}
        for name in names:
            raw = self.root.read_small(name, _LIMIT) or b""
            lines = raw.splitlines()
            if not lines or _job(raw) != self.job:
                continue
            for line in lines[1:]:
                try:
                    doc = json.loads(line)
                except ValueError:
                    continue  # a line cut by the kill
                if isinstance(doc, dict):
                    f, size, crc, synced = (
                        doc.get("file"),
                        doc.get("size"),
                        doc.get("crc32"),
                        doc.get("synced"),
                    )
                    if isinstance(f, str) and isinstance(size, int) and isinstance(crc, int):
                        out[f] = (size, crc, synced is True)
        return out

    def start(self, kept: dict[str, Entry]) -> None:
        """Begin this run's journal: the job, then the files it keeps from earlier runs."""
        lines = [json.dumps({"job": self.job})]
        lines += [_line(name, *entry) for name, entry in kept.items()]
        self.root.write_atomic(self.name, ("\n".join(lines) + "\n").encode())

    def finished(self, name: str, size: int, crc: int) -> None:
        line = _line(name, size, crc, self.synced) + "\n"
        with self.lock:
            self.root.append(self.name, line.encode())


def _line(name: str, size: int, crc: int, synced: bool) -> str:
    return json.dumps({"file": name, "size": size, "crc32": crc, "synced": synced})


def _job(raw: bytes | None) -> str | None:
    first = (raw or b"").split(b"\n", 1)[0]
    try:
        doc = json.loads(first)
    except ValueError:
        return None
    job = doc.get("job") if isinstance(doc, dict) else None
    return job if isinstance(job, str) else None


def peek_job(out_dir: str) -> str | None:
    """The job of the journal in a folder not yet taken (only to decide whether a rerun may go on there),
    opened through the input boundary: a link or a FIFO planted under its name is refused, never followed."""
    path = os.path.join(out_dir, JOURNAL)
    if not os.path.lexists(path):
        return None
    try:
        fd = open_in(path)
    except (OSError, InspectorError):
        return None
    try:
        return _job(os.pread(fd, 1 << 16, 0))
    except OSError:
        return None
    finally:
        os.close(fd)
