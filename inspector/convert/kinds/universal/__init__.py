"""`--format universal`: a DeepSpeed universal checkpoint in OUT/<tag>_uni plus OUT/latest_universal, for
`load_universal` on any world size. The one module of the kind; what it alone uses sits beside it: `plan` (the
files, pure), `tensors` (one tensor file, streamed), `state` (the small files), `preflight`, `verify`. The
executor runs it like every kind: journalled, resumable, split by --part, published to a bucket."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from inspector.convert.job import FileWriter, Writing
from inspector.convert.kinds.base import (
    Assessment,
    Job,
    Offer,
    OutputKind,
    PlannedFile,
    Request,
    VerifyProgress,
    VerifyResult,
    Why,
)
from inspector.convert.kinds.universal.plan import (
    LATEST,
    UniversalPlan,
    iter_rel_paths,
    plan_universal,
    prepare,
)
from inspector.convert.root import Destination, OutputRoot
from inspector.errors import UnsupportedCheckpointError
from inspector.remote.roots import parent_source
from inspector.scan.model import Checkpoint, Kind
from inspector.system.bytesource import ByteSource, any_remote
from inspector.system.limits import ZIP_THREADS, MemoryBudget
from inspector.system.limits import workers as limits_workers

# files smaller than this on average are written by one thread: a file's Python (its zip records, pickle,
# rename and journal line, ~0.45 ms here) holds the GIL and outweighs its bytes, and a second thread only
# contends for it (the 126-layer 20M demo, 3,795 files of ~62 KB: 2.40-2.48 s at 1 worker, 2.94-2.98 s at 2)
SMALL_FILE = 1 << 20

ADAM = {"exp_avg", "exp_avg_sq"}


@dataclass
class UniversalJob(Job):
    """The model-states copies, then the tensor files, are streamed by the executor into `<tag>_uni.partial/`
    (journalled, split by --part, reused by a rerun), `workers` at once; the small files are written again by
    every finishing run; `latest_universal` goes last, once the folder is in place."""

    kind: str
    out_dir: str
    plan: UniversalPlan
    stage3_rank0_optim: int = 0
    notes: tuple[str, ...] = ()
    workers: int = 1
    uses_selection: bool = False  # the whole checkpoint: selection, dtype, shards and renames do not apply
    keeps_on_cancel: bool = True  # finished files stay in <tag>_uni.partial/ for a rerun
    small_files: bool = False  # under SMALL_FILE on average: one writer into a local OUT

    def writers(self, dest: Destination | None) -> int:
        return 1 if self.small_files and dest is None else self.workers

    def __post_init__(self) -> None:
        self.folder = self.plan.folder
        sizes = self.plan.planned_sizes()
        self._files = tuple(
            PlannedFile(f"{self.folder}/{rel}", sizes.get(rel, 0), exact=False)
            for rel in iter_rel_paths(self.plan)
        )
        tensors = tuple(
            PlannedFile(f"{self.folder}/{f.rel}", sizes[f.rel], exact=False) for f in self.plan.files
        )
        copies = tuple(PlannedFile(f"{self.folder}/{name}", size) for _, name, size in self.plan.copies)
        # the copies first: a ZeRO-1/2 model-states copy (381 MiB of the 200M demo's 2.7 GB, one file) listed
        # last ran alone on one worker at the end (2.2 s at 2 workers against 2.5-3.0 at 1; first: 1.3-1.5 s);
        # the tensor files keep their order, which runs of stage-3 files sharing stripes need
        self._streamed = copies + tensors

    @property
    def files(self) -> tuple[PlannedFile, ...]:
        return self._files

    @property
    def streamed(self) -> tuple[PlannedFile, ...]:
        return self._streamed

    @property
    def identity(self) -> str:
        doc = [self.plan.folder, [list(s) for s in self.plan.source], super().identity]
        return hashlib.sha256(json.dumps(doc).encode()).hexdigest()[:16]

    @property
    def tensor_count(self) -> int:
        """Tensors written: one per parameter and state (fp32, exp_avg, exp_avg_sq), as verify counts them."""
        return len(self.plan.files)

    @property
    def output_bytes(self) -> int:
        return self.plan.total_bytes

    @property
    def where(self) -> str:
        return self.plan.out_dir

    def check_output(self, overwrite: bool) -> None:
        prepare(self.plan, overwrite)

    def leftovers(self, overwrite: bool) -> list[str]:
        prepare(self.plan, overwrite)  # again, now that no one else writes here
        return []

    @contextlib.contextmanager
    def writer(self) -> Iterator[FileWriter]:
        from inspector.convert.kinds.universal.shared_rows import SharedRows
        from inspector.convert.kinds.universal.tensors import (
            READ_AHEAD,
            Buffers,
            chunk_elems,
            write_tensor,
        )
        from inspector.convert.reader import FilePool

        plan, copies = self.plan, len(self.plan.copies)
        chunk, buffers = chunk_elems(self.workers), Buffers()  # one budget, shared by the workers
        with FilePool(*plan.sources) as pool:
            # small stage-3 files gathered from stripes the workers share (`shared_rows.py`)
            shared = SharedRows(pool, plan.files, self.workers)
            # advice on cached pages only costs
            ahead = READ_AHEAD if pool.mostly_cold(shared.reads()[0]) else 0
            shared.ahead = bool(ahead)

            by_folder: dict[str, ByteSource] = {}  # a rank folder's source, resolved once, not once a copy

            def write(index: int, root: OutputRoot, rel: str, w: Writing) -> None:
                if index < copies:  # the copies are streamed first (`__post_init__`), then the tensor files
                    src, _, _ = plan.copies[index]
                    folder = os.path.dirname(src)
                    source = by_folder.get(folder) or by_folder.setdefault(folder, _source_of(plan, src))
                    w.progress(root.copy_in(source, src, rel, fsync=w.fsync), "")
                    return
                t = index - copies
                write_tensor(pool, plan.files[t], root, rel, w, chunk, buffers, ahead, (shared, t))

            yield write

    def before(self, root: OutputRoot, area: str, fsync: bool) -> tuple[tuple[str, int], ...]:
        """`zero/optimizer_state.pt` and the step files: small, written again by every finishing run, so a
        resumed export never trusts one a kill may have damaged."""
        from inspector.convert.kinds.universal.state import write_small

        return write_small(self.plan, root, area, fsync)

    def after(self, root: OutputRoot, fsync: bool) -> tuple[tuple[str, int], ...]:
        return ((LATEST, root.write_atomic(LATEST, self.plan.folder.encode(), fsync=fsync)),)

    def assess(self, budget: MemoryBudget | None = None, free_disk: int | None = None) -> Assessment:
        from inspector.convert.kinds.universal.preflight import assess_universal

        return assess_universal(
            self.plan, budget, free_disk, workers=self.writers(None), stage3_rank0_optim=self.stage3_rank0_optim
        )

    def comparisons(self, verdict: Assessment) -> tuple[tuple[str, int, str], ...]:
        from inspector.convert.kinds.universal.preflight import deepspeed_peak_disk

        disk = deepspeed_peak_disk(self.plan, self.stage3_rank0_optim)
        return (("ds_to_universal", disk, "DeepSpeed's own tool peaks near this on disk"),)

    def read_note(self, verdict: Assessment) -> str:
        return "fp32 masters, both Adam moments and the model-states files"

    def preflight_json(self) -> dict[str, Any]:
        from inspector.convert.kinds.universal.preflight import deepspeed_peak_disk

        return {
            "deepspeed_ds_to_universal_peak_disk_bytes": deepspeed_peak_disk(
                self.plan, self.stage3_rank0_optim
            )
        }

    def cancelled_words(self) -> str:
        return f"the files finished so far are kept in {self.plan.out_dir}.partial; rerun the same command to resume"

    def finished_words(self, report: Any) -> str:
        return (
            f"{self.plan.out_dir} and {os.path.join(self.plan.out_root, LATEST)} written. Resume with "
            f'DeepSpeed: "checkpoint": {{"load_universal": true}} and engine.load_checkpoint({self.plan.out_root!r}).'
        )


def _source_of(plan: UniversalPlan, path: str) -> ByteSource:
    """The checkpoint folder a model-states file is read through (the input boundary opens it)."""
    for src in plan.sources:
        if src.contains(path):
            return src
    return parent_source(path)


def _layout_refusal(ckpt: Checkpoint) -> tuple[Why, str] | None:
    """Pipeline, native-MoE and tensor-parallel checkpoints (ZeRO 1/2) are written like any other, with their
    layout's metadata (`layouts.py`); what its layout says DeepSpeed 0.19.8 cannot resume from a universal
    checkpoint (ZeRO off, plain data parallel included), or did not write, is refused (`Checkpoint.universal`)."""
    if ckpt.universal.not_offered:
        return Why.LAYOUT, ckpt.universal.not_offered
    if ckpt.stage == 0 and (ckpt.parallel is not None or bool(ckpt.ranks)):  # a universal input has no ranks
        return Why.NOT_RESUMABLE, ckpt.universal.zero_off
    return None


class Universal(OutputKind):
    uses_selection = False
    converts_damaged = False  # a universal checkpoint from a damaged source would resume wrong: never forced
    name = "universal"
    label = "DeepSpeed universal checkpoint (resume on any world size)"
    help = (  # `--format` help
        "a DeepSpeed universal checkpoint in OUT/<tag>_uni plus OUT/latest_universal: resume on any world "
        "size with load_universal; OUT may be the checkpoint root"
    )

    def offer(self, ckpt: Checkpoint) -> Offer:
        """Universal needs the optimizer state: rank files with Adam moments for every trainable parameter. A
        checkpoint saved before its first optimizer step has an Adam with no moments yet: refused, in those
        words (not as "not an Adam-family optimizer")."""
        if (why := _layout_refusal(ckpt)) is not None:
            return self._unavailable(*why)
        if not ckpt.ranks or ckpt.ranks[0].optim_file is None:
            return self._unavailable(
                Why.NO_OPTIMIZER, "no ZeRO optimizer files (already universal, or weights only)"
            )
        if ckpt.errors:
            return self._unavailable(
                Why.DAMAGED,
                "the checkpoint has error findings (a damaged checkpoint is never converted to it)",
            )
        trainable = [t for t in ckpt.tensors if t.kind is Kind.TRAINABLE]
        if trainable and all(not t.moments for t in trainable):
            return self._unavailable(
                Why.BEFORE_FIRST_STEP,
                "saved before the first optimizer step: the optimizer has no exp_avg / exp_avg_sq yet",
            )
        if any({m for m, _ in t.moments} != ADAM for t in trainable):
            return self._unavailable(Why.NOT_ADAM, "not an Adam-family optimizer (no exp_avg / exp_avg_sq)")
        return self._available()

    def plan(self, ckpt: Checkpoint, request: Request, out_dir: str) -> UniversalJob:
        offer = self.offer(ckpt)
        if offer.why in (Why.LAYOUT, Why.NOT_RESUMABLE):
            raise UnsupportedCheckpointError(
                f"{ckpt.tag_dir} is {offer.reason}.",
                hint="Export the weights (--format weights or model); they are exact for this layout.",
                title="DeepSpeed cannot resume this layout" if offer.why is Why.NOT_RESUMABLE else None,
            )
        if offer.why is Why.BEFORE_FIRST_STEP:
            raise UnsupportedCheckpointError(
                f"{ckpt.tag_dir} was {offer.reason}.",
                hint="Save a checkpoint after at least one optimizer step, or export the weights (--format model).",
            )
        plan = plan_universal(ckpt, os.path.abspath(out_dir))
        rank0 = ckpt.ranks[0].optim_bytes if ckpt.stage == 3 and ckpt.ranks else 0
        notes = (
            "The whole checkpoint (fp32 masters, both Adam moments, the step); selection, dtype, shard size "
            "and renames do not apply.",
        )
        # --workers: files written at once, by the one rule (`limits.workers`) at the zip's own ceiling
        # (ZIP_THREADS: CRC-32 holds no GIL for a whole MiB); one where the files are small
        workers = limits_workers(request.options.workers, remote := any_remote(plan.sources), ZIP_THREADS)
        small = not remote and bool(plan.files) and plan.tensor_bytes < SMALL_FILE * len(plan.files)
        return UniversalJob(self.name, os.path.abspath(out_dir), plan, rank0, notes, workers, small_files=small)

    def busy(self, ckpt: Checkpoint, out_dir: str, overwrite: bool) -> str:
        """OUT may hold anything (the checkpoint root, say): only <tag>_uni must not exist yet."""
        folder = os.path.join(out_dir, f"{ckpt.tag}_uni")
        return f"{folder} exists" if os.path.lexists(folder) and not overwrite else ""

    def _folder(self, out_dir: str) -> str | None:
        from inspector.scan.layouts import universal_folder

        return universal_folder(out_dir, prefer=True)

    def owns(self, out_dir: str) -> bool:
        return self._folder(out_dir) is not None

    def recorded_tag(self, out_dir: str) -> str | None:
        folder = self._folder(out_dir)
        name = os.path.basename(folder.rstrip("/")) if folder else ""
        return name[: -len("_uni")] if name.endswith("_uni") else None

    def verify(
        self,
        ckpt: Checkpoint,
        out_dir: str,
        *,
        against: str | None = None,
        cancel: threading.Event | None = None,
    ) -> Iterator[VerifyProgress | VerifyResult]:
        from inspector.convert.kinds.universal.verify import verify_universal
        from inspector.scan.scanner import scan

        if against is not None:
            self.refuse_against(
                "a universal checkpoint is checked against the fp32 masters and both Adam moments."
            )
        folder = self._folder(out_dir)
        assert folder is not None
        return verify_universal(ckpt, scan(folder), cancel=cancel)
