"""What the four safetensors kinds (weights, model, adapter, merged) share: a Job around a ConversionPlan and
the files written beside it, run by the engine, and the verify of a safetensors output."""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from inspector.convert.job import FileWriter, Writing
from inspector.convert.journal import JOURNAL, peek_job
from inspector.convert.kinds.base import (
    Assessment,
    Job,
    OutputKind,
    PlannedFile,
    VerifyProgress,
    VerifyResult,
)
from inspector.convert.outnames import entries
from inspector.convert.pipeline import shard_streamer, shards_at_once
from inspector.convert.plan import INDEX_NAME, SINGLE_NAME, ConversionPlan
from inspector.convert.preflight import assess
from inspector.convert.root import LOCK, PARTIAL, OutputRoot, busy, lock_holder
from inspector.convert.verify import recorded_tag, run_verify
from inspector.convert.writers.hf_folder import SideFile
from inspector.errors import OutputError
from inspector.remote.roots import absolute, parent_source, source_at
from inspector.scan.model import Checkpoint
from inspector.system.limits import MemoryBudget

# fills shard `index`'s open file (fd, cancel, fsync), yielding (bytes, tensor) as it goes
ShardWriter = Callable[[int, int, threading.Event, bool], Iterator[tuple[int, str]]]


@dataclass
class SafetensorsJob(Job):
    """Shards from a ConversionPlan (streamed by the executor), then the index and the side files, so a failed
    run never leaves a config that looks loadable. `shard_writer` computes the bytes where they are not the
    checkpoint's own (a merge); `extra_memory` is the working memory it needs beyond the chunk buffers."""

    kind: str
    out_dir: str
    plan: ConversionPlan
    side_files: tuple[SideFile, ...] = ()
    notes: tuple[str, ...] = ()
    shard_writer: ShardWriter | None = None
    extra_memory: int = 0
    uses_selection: bool = True

    @property
    def workers(self) -> int:  # type: ignore[override]  # Job's class default, decided here from the plan
        """Shards written side by side: two when there are two and more than one worker, so the next shard's
        chunks start while the last one's tail, fsync and checksum finish. Both take their chunks' buffers from
        the pipeline's one pool (`shard_streamer`), so this costs no memory."""
        return shards_at_once(self.plan)

    @property
    def files(self) -> tuple[PlannedFile, ...]:
        index = [PlannedFile(INDEX_NAME, len(self.plan.index))] if self.plan.index else []
        return (*self.streamed, *index, *(PlannedFile(f.name, f.nbytes) for f in self.side_files))

    @property
    def streamed(self) -> tuple[PlannedFile, ...]:
        return tuple(PlannedFile(s.filename, s.file_bytes) for s in self.plan.shards)

    @property
    def tensor_count(self) -> int:
        return self.plan.tensor_count

    @property
    def identity(self) -> str:
        return f"{self.plan.fingerprint}-{super().identity}"  # the plan's sources and choices, and the side files

    def check_output(self, overwrite: bool) -> None:
        prepare_output(self.plan, self.out_dir, overwrite, self.identity)

    def leftovers(self, overwrite: bool) -> list[str]:
        return prepare_output(self.plan, self.out_dir, overwrite, self.identity)

    def head(self, index: int) -> bytes:
        return self.plan.shards[index].header

    def tensors_in(self, indices: list[int]) -> int:
        return sum(len(self.plan.shards[i].tensors) for i in indices)

    @contextlib.contextmanager
    def writer(self) -> Iterator[FileWriter]:
        fill = self.shard_writer or shard_streamer(self.plan)

        def write(index: int, root: OutputRoot, rel: str, w: Writing) -> None:
            fd = root.create(rel)
            try:
                for nbytes, tensor in fill(index, fd, w.cancel, w.fsync):
                    w.progress(nbytes, tensor)
            finally:
                os.close(fd)

        yield write

    def after(self, root: OutputRoot, fsync: bool) -> tuple[tuple[str, int], ...]:
        """The index, then the side files: in place only once the weights are."""
        index: tuple[tuple[str, int], ...] = ()
        if self.plan.index is not None:
            index = ((INDEX_NAME, root.write_atomic(INDEX_NAME, self.plan.index, fsync=fsync)),)
        return index + tuple((f.name, _write_side(root, f, fsync)) for f in self.side_files)

    def assess(self, budget: MemoryBudget | None = None, free_disk: int | None = None) -> Assessment:
        side = sum(f.nbytes for f in self.side_files)
        return assess(
            self.plan,
            self.out_dir,
            budget,
            free_disk,
            extra_output_bytes=side,
            extra_memory=self.extra_memory,
        )

    def comparisons(self, verdict: Assessment) -> tuple[tuple[str, int, str], ...]:
        if self.plan.model_parallel:  # zero_to_fp32 fails on every model-parallel layout: no figure to set beside
            return ()
        return (
            (
                "zero_to_fp32",
                verdict.deepspeed_peak_rss,
                "peak RAM of DeepSpeed's own tool, same job (predicted)",
            ),
        )

    def read_note(self, verdict: Assessment) -> str:
        by, source = self.plan.read_bytes_by_source, self.plan.options.source
        other = "module" if source == "masters" else "masters"
        note = f"from the {source}"
        if by.get(other, verdict.read_bytes) != verdict.read_bytes:
            from inspector.system.units import format_bytes

            note += f" · --source {other} would read {format_bytes(by[other])}"
        return note

    def preflight_json(self) -> dict[str, Any]:
        return {
            "source": self.plan.options.source,
            "read_bytes_by_source": dict(self.plan.read_bytes_by_source),
            "shards": len(self.plan.shards),
        }


def weights_job(plan: ConversionPlan, out_dir: str) -> SafetensorsJob:
    """A plan's shards (and index) alone, as a job (scripts, tests)."""
    return SafetensorsJob("weights", os.path.abspath(out_dir), plan)


_OUR_NAMES = (SINGLE_NAME, INDEX_NAME)


def ours(name: str) -> bool:
    """Files a previous run of this tool may have left: shards, index, partials, journal, locks."""
    base = name[: -len(PARTIAL)] if name.endswith(PARTIAL) else name
    return (
        base in _OUR_NAMES
        or name.startswith((JOURNAL, LOCK))
        or (base.startswith("model-") and base.endswith(".safetensors") and "-of-" in base)
    )


def prepare_output(plan: ConversionPlan, out_dir: str, overwrite: bool, job: str) -> list[str]:
    """Check the output folder; returns stale files of ours to remove once the new output is in place."""
    if os.path.exists(out_dir) and not os.path.isdir(out_dir):
        raise OutputError(f"{out_dir} exists and is not a folder.", hint="Choose another output path.")
    real_out = os.path.realpath(out_dir)
    for f in plan.shards[0].tensors[:1]:
        if f.segments and os.path.dirname(os.path.realpath(f.segments[0].file)) == real_out:
            raise OutputError(
                "The output folder is the checkpoint's tag folder.",
                hint="Write the conversion to a separate folder.",
            )
    probe = out_dir
    while not os.path.exists(probe):  # created only when the run starts, so a refusal leaves nothing
        probe = os.path.dirname(probe)
    if not os.access(probe, os.W_OK):
        raise OutputError(f"{probe} is not writable.", hint="Choose a folder you can write to.")
    existing = entries(out_dir)
    foreign = [n for n in existing if not ours(n)]
    # partial files no run of this plan writes: another conversion's (another shard count), left by a kill or
    # still being written; published beside ours they would be taken for part of this output
    planned_partials = {n + PARTIAL for n in plan.filenames} | {INDEX_NAME + PARTIAL}
    others = [n for n in existing if n.endswith(PARTIAL) and n not in planned_partials]
    if others and (holder := lock_holder(out_dir)) is not None:
        raise busy(out_dir, holder)  # a running job's partial files: the folder is busy, not foreign
    foreign += others
    finals = [
        n for n in existing if ours(n) and not n.endswith(PARTIAL) and not n.startswith((JOURNAL, LOCK))
    ]
    planned = set(plan.filenames)
    # a run of this very job killed while renaming its finished shards may have left some in place
    resumable = peek_job(out_dir) == job and set(finals) <= planned
    if (foreign or finals) and not overwrite and not (resumable and not foreign):
        shown = ", ".join((foreign + finals)[:5]) + (" …" if len(foreign + finals) > 5 else "")
        raise OutputError(
            f"{out_dir} is not empty ({shown}).",
            hint="Choose an empty folder, or pass --overwrite to replace the files this conversion writes "
            "there (its safetensors and index; with --format model also config.json, generation_config.json "
            "and the tokenizer files); other files are left alone.",
            title="Output folder not empty",
        )
    return [n for n in finals if n not in planned] + [n for n in foreign if n.endswith(PARTIAL)]


def _write_side(root: OutputRoot, f: SideFile, fsync: bool) -> int:
    """A config, tokenizer or adapter_config: copied as a regular file from inside its source folder (the input
    boundary refuses a link out of it), or our edited bytes; in place all at once."""
    try:
        if f.content is not None:
            return root.write_atomic(f.name, f.content, fsync=fsync)
        assert f.source is not None
        return root.copy_in(f.origin or parent_source(f.source), f.source, f.name, fsync=fsync)
    except OSError as exc:
        raise OutputError(f"Writing {root.show(f.name)} failed: {exc.strerror}.") from None


def has_file(out_dir: str, name: str) -> bool:
    """Whether OUT (a folder or an s3:// prefix) holds the file `name`."""
    out = source_at(out_dir, "output folder")
    return out.entry(out.absolute(f"{out_dir.rstrip('/')}/{name}")) == "file"


class SafetensorsKind(OutputKind):
    """Verify and the recorded tag of a safetensors output (the output's header says what it was made from)."""

    def owns(self, out_dir: str) -> bool:
        """Safetensors weights. A merged model is safetensors weights too: the registry asks the merged kind
        first (`kinds.of_output`, most specific first), so this kind need not know it."""
        return has_file(out_dir, SINGLE_NAME) or has_file(out_dir, INDEX_NAME)

    def recorded_tag(self, out_dir: str) -> str | None:
        return recorded_tag(out_dir)

    def verify(
        self,
        ckpt: Checkpoint,
        out_dir: str,
        *,
        against: str | None = None,
        cancel: threading.Event | None = None,
    ) -> Iterator[VerifyProgress | VerifyResult]:
        return run_verify(ckpt, absolute(out_dir), cancel=cancel, against=against)
