"""The protocol every output kind implements, and the shapes every kind shares.

An OutputKind says whether it is offered for a checkpoint (and why not), plans a Job (pure: which files, from
which bytes), and verifies an output of its kind independently of its writer. A Job answers preflight with the
one verdict type (`preflight.Assessment`), refuses a busy output before any work, and runs as a stream of the
one progress shape (`executor.Progress`) ending in the one `executor.Report`; verify streams `VerifyProgress` and
ends in the one `VerifyResult`. The front ends hold a kind and a job and never ask which kind it is.
"""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from collections.abc import Iterator
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, NoReturn

from inspector.convert.executor import Progress, Report, run
from inspector.convert.job import FileWriter, OutputJob, PlannedFile, Writing
from inspector.convert.options import ConvertOptions
from inspector.convert.outnames import entries
from inspector.convert.preflight import Assessment
from inspector.convert.root import Destination
from inspector.convert.verify import VerifyProgress, VerifyResult
from inspector.errors import InvalidOptionError
from inspector.scan.model import Checkpoint
from inspector.system.limits import MemoryBudget

__all__ = [
    "Assessment",
    "FileWriter",
    "Job",
    "Offer",
    "OutputJob",
    "OutputKind",
    "PlannedFile",
    "Progress",
    "Report",
    "Request",
    "VerifyProgress",
    "VerifyResult",
    "Why",
    "Writing",
]


class Why(Enum):
    """Why a kind is not offered for a checkpoint: the code decisions are made on (the words are for people)."""

    NO_OPTIMIZER = "no-optimizer"  # no ZeRO optimizer files
    DAMAGED = "damaged"  # the scan found errors
    BEFORE_FIRST_STEP = "before-first-step"  # an Adam with no moments yet
    NOT_ADAM = "not-adam"
    NO_CONFIG = "no-config"  # not a Trainer checkpoint (no config.json)
    NO_LORA = "no-lora"
    NO_ADAPTER_CONFIG = "no-adapter-config"
    ADAPTER_PROBLEM = "adapter-problem"
    LAYOUT = "layout"  # a parallel layout (pipeline, expert, tensor) this kind cannot write from yet
    NOT_RESUMABLE = "not-resumable"  # DeepSpeed cannot resume it from this layout (native MoE, ZeRO off)


@dataclass(frozen=True)
class Offer:
    """Whether a kind can be written for a checkpoint; `why` says why not, as a code, and `reason` in words."""

    name: str
    label: str
    available: bool
    reason: str = ""
    quiet: bool = False  # its absence is not worth a word (an adapter kind on a checkpoint without LoRA)
    why: Why | None = None


@dataclass(frozen=True)
class Request:
    """What the user asked, the same for every kind (a kind ignores what does not apply to it and says so in
    its notes)."""

    options: ConvertOptions = field(default_factory=ConvertOptions)
    base: str | None = None  # the base model folder a merge folds the adapter into
    side_files: bool = True  # config, tokenizer, adapter_config beside the weights (off: weights only)
    allow_damaged: bool = False




class Job(OutputJob):
    """One planned output of one kind: what the executor writes (`convert.job.OutputJob`), plus what the
    front ends ask of it: its preflight verdict, its comparison with DeepSpeed's tools, and `run`."""

    notes: tuple[str, ...] = ()
    uses_selection: bool = True  # False: the whole checkpoint is written, whatever is selected

    @abstractmethod
    def assess(self, budget: MemoryBudget | None = None, free_disk: int | None = None) -> Assessment:
        """The preflight verdict: predicted peak RSS, disk, time, against this machine's limits."""

    def comparisons(self, verdict: Assessment) -> tuple[tuple[str, int, str], ...]:
        """Rows (label, bytes, note) setting DeepSpeed's own tool beside us for the same job."""
        return ()

    def read_note(self, verdict: Assessment) -> str:
        """Where the bytes read come from, in words."""
        return "from the checkpoint"

    def preflight_json(self) -> dict[str, Any]:
        """What `preflight --json` adds for this kind to the shared keys (figures DeepSpeed's tool would need)."""
        return {}

    def run(
        self,
        *,
        cancel: threading.Event | None = None,
        overwrite: bool = False,
        fsync: bool = False,
        part: tuple[int, int] | None = None,
        dest: Destination | None = None,
    ) -> Iterator[Progress | Report]:
        """Write the output through its OutputRoot: Progress events (<= 4/s), then one Report. Cancel and
        errors remove partial files (or keep finished ones for a rerun: `keeps_on_cancel`). After a kill,
        a rerun of the same command reuses the files its journal lists with their checksums.

        `part` (i, n): write only part i of n of the files (n runs side by side into one folder, one per node)
        and publish nothing; the same job run without `part` afterwards finishes the folder, reusing them. A
        kind that cannot split says so with an InspectorError before anything is written.

        `dest`: OUT is a bucket (`convert.bucket`): the job's folder is a staging folder and every finished file
        is published there through the OutputRoot."""
        return run(self, cancel=cancel, overwrite=overwrite, fsync=fsync, part=part, dest=dest)

    def finished_words(self, report: Report) -> str:
        """What to tell the user once it is written (how to load or resume it); "" for nothing more."""
        return ""


class OutputKind(ABC):
    """One kind of output. A new kind is a module with a subclass and a line in `kinds.KINDS`."""

    name: str  # `convert --format NAME`
    label: str
    help: str  # what `--format NAME` writes, for the command line's help
    uses_selection: bool = True  # False: the whole checkpoint is written, whatever is selected
    takes_base: bool = False  # it reads a base model folder (--base)
    converts_damaged: bool = True  # with --force it writes a checkpoint the scan found errors in

    @abstractmethod
    def offer(self, ckpt: Checkpoint) -> Offer:
        """Whether this kind can be written for `ckpt`, and why not."""

    @abstractmethod
    def plan(self, ckpt: Checkpoint, request: Request, out_dir: str) -> Job:
        """Plan the output (pure: reads metadata, writes nothing); raises an InspectorError saying why not."""

    @abstractmethod
    def owns(self, out_dir: str) -> bool:
        """Whether `out_dir` holds an output of this kind (for `verify`)."""

    def busy(self, ckpt: Checkpoint, out_dir: str, overwrite: bool) -> str:
        """A quick look, before planning, at whether `out_dir` would refuse this kind: the problem in words
        ("" when it would not). The job's `check_output` is the full check."""
        if overwrite or not entries(out_dir):
            return ""
        return f"{out_dir} is not empty"

    def recorded_tag(self, out_dir: str) -> str | None:
        """The checkpoint tag an output of this kind was made from, when it records one."""
        return None

    @abstractmethod
    def verify(
        self,
        ckpt: Checkpoint,
        out_dir: str,
        *,
        against: str | None = None,
        cancel: threading.Event | None = None,
    ) -> Iterator[VerifyProgress | VerifyResult]:
        """Check an output of this kind against `ckpt`, independently of the writer."""

    def refuse_against(self, words: str) -> NoReturn:
        """`verify --against` for a kind whose check does not read one chosen source: the one refusal, with
        `words` saying what the kind is checked against instead."""
        raise InvalidOptionError(
            f"--against applies to safetensors outputs (weights, model, adapter); {words}",
        )

    def _unavailable(self, why: Why, reason: str, *, quiet: bool = False) -> Offer:
        return Offer(self.name, self.label, False, reason, quiet, why)

    def _available(self) -> Offer:
        return Offer(self.name, self.label, True)
