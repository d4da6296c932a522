"""What the four safetensors kinds (weights, model, adapter, merged) share: a Job around a ConversionPlan and
the files written beside it, run by the engine, and the verify of a safetensors output."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from inspector.convert.engine import Progress, Report, ShardWriter, run
from inspector.convert.kinds.base import (
    Assessment,
    Job,
    OutputKind,
    PlannedFile,
    VerifyProgress,
    VerifyResult,
)
from inspector.convert.output import prepare_output
from inspector.convert.plan import INDEX_NAME, SINGLE_NAME, ConversionPlan
from inspector.convert.preflight import assess
from inspector.convert.root import Destination, OutputRoot
from inspector.convert.verify import recorded_tag, run_verify
from inspector.convert.writers.hf_folder import SideFile
from inspector.errors import OutputError
from inspector.scan.model import Checkpoint
from inspector.system.bytesource import absolute, is_file, is_url, source_at
from inspector.system.limits import MemoryBudget


@dataclass
class SafetensorsJob(Job):
    """Shards (and the index) from a ConversionPlan, then the side files, so a failed run never leaves a
    config that looks loadable. `shard_writer` computes the bytes where they are not the checkpoint's own
    (a merge); `extra_memory` is the working memory it needs beyond the chunk buffers."""

    kind: str
    out_dir: str
    plan: ConversionPlan
    side_files: tuple[SideFile, ...] = ()
    notes: tuple[str, ...] = ()
    shard_writer: ShardWriter | None = None
    extra_memory: int = 0

    @property
    def files(self) -> tuple[PlannedFile, ...]:
        shards = [PlannedFile(s.filename, s.file_bytes) for s in self.plan.shards]
        index = [PlannedFile(INDEX_NAME, len(self.plan.index))] if self.plan.index else []
        return (*shards, *index, *(PlannedFile(f.name, f.nbytes) for f in self.side_files))

    @property
    def tensor_count(self) -> int:
        return self.plan.tensor_count

    @property
    def identity(self) -> str:
        return f"{self.plan.fingerprint}-{super().identity}"  # the plan's sources and choices, and the side files

    def check_output(self, overwrite: bool) -> None:
        prepare_output(self.plan, self.out_dir, overwrite)

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

    def run(
        self,
        *,
        cancel: threading.Event | None = None,
        overwrite: bool = False,
        fsync: bool = False,
        part: tuple[int, int] | None = None,
        dest: Destination | None = None,
    ) -> Iterator[Progress | Report]:
        def side(root: OutputRoot) -> tuple[tuple[str, int], ...]:
            return tuple((f.name, _write_side(root, f, fsync)) for f in self.side_files)

        return run(
            self.plan,
            self.out_dir,
            cancel=cancel,
            overwrite=overwrite,
            fsync=fsync,
            shard_writer=self.shard_writer,
            side_writer=side,
            part=part,
            dest=dest,
        )


def _write_side(root: OutputRoot, f: SideFile, fsync: bool) -> int:
    """A config, tokenizer or adapter_config: copied as a regular file from inside its source folder (the input
    boundary refuses a link out of it), or our edited bytes; in place all at once."""
    try:
        if f.content is not None:
            return root.write_atomic(f.name, f.content, fsync=fsync)
        assert f.source is not None
        return root.copy_in(f.origin or source_at(os.path.dirname(f.source)), f.source, f.name, fsync=fsync)
    except OSError as exc:
        raise OutputError(f"Writing {root.show(f.name)} failed: {exc.strerror}.") from None


def has_file(out_dir: str, name: str) -> bool:
    """Whether OUT (a folder or an s3:// prefix) holds the file `name`."""
    return is_file(f"{out_dir.rstrip('/')}/{name}" if is_url(out_dir) else os.path.join(out_dir, name))


class SafetensorsKind(OutputKind):
    """Verify and the recorded tag of a safetensors output (the output's header says what it was made from)."""

    def owns(self, out_dir: str) -> bool:
        """Plain safetensors weights (a merged model says so in its header, and is the merged kind's)."""
        from inspector.convert.writers.merge import is_merged_output

        return (has_file(out_dir, SINGLE_NAME) or has_file(out_dir, INDEX_NAME)) and not is_merged_output(out_dir)

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
