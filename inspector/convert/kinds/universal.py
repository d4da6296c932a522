"""`--format universal`: a DeepSpeed universal checkpoint in OUT/<tag>_uni plus OUT/latest_universal, for
`load_universal` on any world size (writer: `writers.universal`; files journalled with CRC-32, resumable)."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from inspector.convert.engine import Progress, Report
from inspector.convert.kinds.base import (
    Assessment,
    Job,
    Offer,
    OutputKind,
    PlannedFile,
    Request,
    VerifyProgress,
    VerifyResult,
)
from inspector.convert.root import Destination
from inspector.convert.writers.universal import (
    UniversalPlan,
    iter_rel_paths,
    plan_universal,
    prepare,
    write_universal,
)
from inspector.convert.writers.universal_preflight import assess_universal
from inspector.errors import DamagedCheckpointError
from inspector.scan.model import Checkpoint, Kind
from inspector.system.limits import MemoryBudget

ADAM = {"exp_avg", "exp_avg_sq"}
_EVENT_INTERVAL = 0.25


@dataclass
class UniversalJob(Job):
    kind: str
    out_dir: str
    plan: UniversalPlan
    stage3_rank0_optim: int = 0
    notes: tuple[str, ...] = ()
    uses_selection: bool = False  # the whole checkpoint: selection, dtype, shards and renames do not apply
    keeps_on_cancel: bool = True  # finished files stay in <tag>_uni.partial/ for a rerun

    @property
    def files(self) -> tuple[PlannedFile, ...]:
        sizes = self.plan.planned_sizes()
        return tuple(
            PlannedFile(f"{self.plan.folder}/{rel}", sizes.get(rel, 0)) for rel in iter_rel_paths(self.plan)
        )

    @property
    def files_at_once(self) -> int:  # type: ignore[override]
        from inspector.convert.writers.universal import default_workers

        return default_workers()

    @property
    def identity(self) -> str:
        import hashlib
        import json

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

    def assess(self, budget: MemoryBudget | None = None, free_disk: int | None = None) -> Assessment:
        return assess_universal(self.plan, budget, free_disk, stage3_rank0_optim=self.stage3_rank0_optim)

    def comparisons(self, verdict: Assessment) -> tuple[tuple[str, int, str], ...]:
        from inspector.convert.writers.universal_preflight import deepspeed_peak_disk

        disk = deepspeed_peak_disk(self.plan, self.stage3_rank0_optim)
        return (("ds_to_universal", disk, "DeepSpeed's own tool peaks near this on disk"),)

    def read_note(self, verdict: Assessment) -> str:
        return "fp32 masters, both Adam moments and the model-states files"

    def preflight_json(self) -> dict[str, Any]:
        from inspector.convert.writers.universal_preflight import deepspeed_peak_disk

        return {
            "deepspeed_ds_to_universal_peak_disk_bytes": deepspeed_peak_disk(
                self.plan, self.stage3_rank0_optim
            )
        }

    def run(
        self,
        *,
        cancel: threading.Event | None = None,
        overwrite: bool = False,
        fsync: bool = False,
        part: tuple[int, int] | None = None,
        dest: Destination | None = None,
    ) -> Iterator[Progress | Report]:
        """The writer works on its own threads; this turns its byte count into Progress events. An interrupt
        (Ctrl-C, SIGTERM) cancels it and waits for it to release OUT: finished files stay for a rerun."""
        cancel = cancel or threading.Event()
        if part is None:
            total = self.plan.total_bytes
        else:  # a part writes only its share of the tensor files
            from inspector.convert.writers.universal import file_part

            total = sum(self.plan.files[k].nbytes for k in file_part(self.plan, part))
        done = [0]
        lock = threading.Lock()
        result: list[Any] = []
        error: list[BaseException] = []
        finished = threading.Event()

        def progress(n: int) -> None:
            with lock:
                done[0] += n

        def work() -> None:
            try:
                result.append(
                    write_universal(
                        self.plan,
                        overwrite=overwrite,
                        cancel=cancel,
                        progress=progress,
                        part=part,
                        fsync=fsync,
                        dest=dest,
                    )
                )
            except BaseException as exc:
                error.append(exc)
            finally:
                finished.set()

        start = time.monotonic()
        threading.Thread(target=work, name="zi-universal", daemon=True).start()
        name = self.plan.folder
        try:
            # an Event, not join(timeout): a join interrupted by a signal may return while the thread runs
            while not finished.wait(_EVENT_INTERVAL):
                yield Progress(min(done[0], total), total, "", name, 0, 1, time.monotonic() - start)
        except BaseException:  # interrupted, or the consumer closed us: stop the writer before going on
            cancel.set()
            finished.wait()
            raise
        if error:
            raise error[0]
        report = result[0]
        elapsed = time.monotonic() - start
        yield Progress(total, total, "", name, 0, 1, elapsed)
        yield Report(
            report.out_dir,  # a part's files stay in <tag>_uni.partial until the finishing run
            ((os.path.basename(report.out_dir), report.bytes_written),),
            report.files if part else self.tensor_count,
            report.bytes_written,
            elapsed,
            report.reused,
        )

    def cancelled_words(self) -> str:
        return f"the files finished so far are kept in {self.plan.out_dir}.partial; rerun the same command to resume"

    def finished_words(self, report: Report) -> str:
        return (
            f"{self.plan.out_dir} and {os.path.join(self.plan.out_root, 'latest_universal')} written. Resume with "
            f'DeepSpeed: "checkpoint": {{"load_universal": true}} and engine.load_checkpoint({self.plan.out_root!r}).'
        )


class Universal(OutputKind):
    uses_selection = False
    name = "universal"
    label = "DeepSpeed universal checkpoint (resume on any world size)"
    help = (
        "a DeepSpeed universal checkpoint in OUT/<tag>_uni plus OUT/latest_universal: resume on any world size "
        "with load_universal; OUT may be the checkpoint root"
    )

    def offer(self, ckpt: Checkpoint) -> Offer:
        """Universal needs the optimizer state: rank files with Adam moments for every trainable parameter. A
        checkpoint saved before its first optimizer step has an Adam with no moments yet: refused, in those
        words (not as "not an Adam-family optimizer")."""
        if ckpt.parallel is not None:  # DeepSpeed needs per-layout metadata this writer does not make yet
            return self._unavailable(
                f"a {ckpt.parallel.kind}-parallel checkpoint: writing a universal checkpoint "
                "from this layout is not supported yet (export the weights instead)"
            )
        if not ckpt.ranks or ckpt.ranks[0].optim_file is None:
            return self._unavailable("no ZeRO optimizer files (already universal, or weights only)")
        if ckpt.errors:
            return self._unavailable("the checkpoint has error findings")
        trainable = [t for t in ckpt.tensors if t.kind is Kind.TRAINABLE]
        if trainable and all(not t.moments for t in trainable):
            return self._unavailable(
                "saved before the first optimizer step: the optimizer has no exp_avg / exp_avg_sq yet"
            )
        if any({m for m, _ in t.moments} != ADAM for t in trainable):
            return self._unavailable("not an Adam-family optimizer (no exp_avg / exp_avg_sq)")
        return self._available()

    def plan(self, ckpt: Checkpoint, request: Request, out_dir: str) -> UniversalJob:
        if ckpt.errors and not request.allow_damaged:
            raise DamagedCheckpointError(
                f"{ckpt.tag_dir} has {len(ckpt.errors)} error finding(s); see `zero-inspector scan`.",
                hint="A universal checkpoint from a damaged source would resume wrong.",
            )
        offer = self.offer(ckpt)
        if not offer.available and ckpt.parallel is not None:
            from inspector.errors import UnsupportedCheckpointError

            raise UnsupportedCheckpointError(
                f"{ckpt.tag_dir} is {offer.reason}.",
                hint="Export the weights (--format weights or model); they are exact for this layout.",
            )
        if not offer.available and "first optimizer step" in offer.reason:
            from inspector.errors import UnsupportedCheckpointError

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
        return UniversalJob(self.name, os.path.abspath(out_dir), plan, rank0, notes)

    def busy(self, ckpt: Checkpoint, out_dir: str, overwrite: bool) -> str:
        """OUT may hold anything (the checkpoint root, say): only <tag>_uni must not exist yet."""
        folder = os.path.join(out_dir, f"{ckpt.tag}_uni")
        return f"{folder} exists" if os.path.lexists(folder) and not overwrite else ""

    def _folder(self, out_dir: str) -> str | None:
        from inspector.scan.universal import find_universal

        return find_universal(out_dir, prefer=True)

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
        from inspector.convert.writers.universal_verify import verify_universal
        from inspector.scan.universal import scan_universal

        folder = self._folder(out_dir)
        assert folder is not None
        return verify_universal(ckpt, scan_universal(folder))
