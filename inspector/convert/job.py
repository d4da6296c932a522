"""What the one executor writes, apart from the kinds that plan it: the files a job offers (`PlannedFile`),
how one is written (`FileWriter`, handed a `Writing`), and the executor's side of a job (`OutputJob`).

Below both the executor and the kinds (`kinds.base.Job` extends `OutputJob`), so neither needs the other's
module to name these: the executor knows jobs only by this contract.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field

from inspector.convert.root import Destination, OutputRoot


@dataclass(frozen=True)
class PlannedFile:
    """One file a job writes, relative to its output folder, with its planned size (`exact`: to the byte;
    else an estimate, such as a pickle's framing)."""

    name: str
    nbytes: int
    exact: bool = True


@dataclass(frozen=True)
class Writing:
    """What a file writer is handed besides the root and the name: cancel, fsync and where to count bytes."""

    cancel: threading.Event
    fsync: bool
    progress: Callable[[int, str], None]  # (bytes written since the last call, the tensor in hand)
    # (size, CRC-32) of the whole file, where the writer checksummed the bytes as it wrote them: the executor
    # journals that instead of reading the file back (a second pass over every byte written)
    known: list[tuple[int, int]] = field(default_factory=list)

    def checksummed(self, size: int, crc: int) -> None:
        """The file just written has `size` bytes with CRC-32 `crc` (computed on the bytes in hand)."""
        self.known[:] = [(size, crc)]


FileWriter = Callable[[int, OutputRoot, str, Writing], None]  # (file index, root, where to write it, ...)


class OutputJob(ABC):
    """What the one executor (`convert.executor`) writes: a job's `streamed` files and how to write file *i*
    (`writer`), plus what it writes before and after them. `kinds.base.Job` adds what the front ends ask."""

    kind: str
    out_dir: str  # the folder the user named (OUT): the executor's OutputRoot
    workers: int = 1  # streamed files written side by side (what a bucket output's staging folder holds at once)
    folder: str = ""  # "": each streamed file waits as NAME.partial; else they all live in FOLDER/, which
    # waits as FOLDER.partial/ and is renamed whole

    def writers(self, dest: Destination | None) -> int:
        """Files written at once: `workers` (a kind whose files are all small writes them one at a time into a
        local OUT; `dest`: the bucket they are published to, whose uploads want every worker)."""
        return self.workers

    @property
    def identity(self) -> str:
        """What fixes every output byte (sources, choices), hashed: a rerun of the same job has the same one,
        so a bucket output can tell this job's finished objects from anyone else's."""
        doc = [self.kind, [(f.name, f.nbytes) for f in self.files]]
        return hashlib.sha256(json.dumps(doc).encode()).hexdigest()[:16]

    @property
    @abstractmethod
    def files(self) -> tuple[PlannedFile, ...]:
        """Every file written, in the order they are written."""

    # -- what the executor asks ------------------------------------------------------------------------

    @property
    def streamed(self) -> tuple[PlannedFile, ...]:
        """The files written one by one: journalled, split by `--part`, reused by a rerun, published in
        this order."""
        return self.files

    @abstractmethod
    def writer(self) -> contextlib.AbstractContextManager[FileWriter]:
        """What writes streamed file *i* at the name the executor gives (through the root), for one run."""

    def head(self, index: int) -> bytes:
        """The first bytes a finished streamed file must have (a reused file is checked against them)."""
        return b""

    def tensors_in(self, indices: list[int]) -> int:
        """Tensors the streamed files `indices` hold (a part's report)."""
        return len(indices)

    def leftovers(self, overwrite: bool) -> list[str]:
        """Files of an earlier output that the published output replaces (removed once it is in place)."""
        return []

    def before(self, root: OutputRoot, area: str, fsync: bool) -> tuple[tuple[str, int], ...]:
        """Files the finishing run writes first, on every run, into the staging `area` (small, never reused)."""
        return ()

    def after(self, root: OutputRoot, fsync: bool) -> tuple[tuple[str, int], ...]:
        """Files written once the streamed files are in place (an index, side files, a pointer)."""
        return ()

    @property
    @abstractmethod
    def tensor_count(self) -> int: ...

    @property
    def output_bytes(self) -> int:
        return sum(f.nbytes for f in self.files)

    @property
    def where(self) -> str:
        """The folder the output lands in (OUT, or a folder the kind makes inside it)."""
        return self.out_dir

    @abstractmethod
    def check_output(self, overwrite: bool) -> None:
        """Refuse an output folder this job may not write into, before any work or prediction."""

    keeps_on_cancel: bool = False  # cancel keeps the finished files for a rerun (else it removes them all)

    def cancelled_words(self) -> str:
        """What an interrupted run left, in words."""
        return "partial output was removed"
