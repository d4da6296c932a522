"""The immutable picture of a scanned checkpoint: where every byte of every output tensor lives.

Scanning builds these from metadata alone; planning and execution only read them. Nothing here imports
torch, so the model is cheap to build, pickle and hand to a UI thread.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from itertools import accumulate, islice
from typing import TYPE_CHECKING, Any

from inspector.errors import UnsafePickleError
from inspector.format.dtypes import FLOATING, itemsize
from inspector.parse.dsconfig import DsConfig
from inspector.scan.holding import Holding, holder_row
from inspector.scan.universal_needs import UniversalNeeds
from inspector.system.bytesource import ByteSource
from inspector.text import has_unsafe, shown

if TYPE_CHECKING:
    from inspector.parse.layers import TpRecipe


class Kind(str, Enum):
    """What a tensor is in the model: optimizer-owned, frozen, a buffer, or a tied alias of another."""

    TRAINABLE = "trainable"
    FROZEN = "frozen"
    BUFFER = "buffer"
    TIED = "tied"

    def __str__(self) -> str:
        return self.value


class Severity(str, Enum):
    ERROR = "error"
    WARNING = "warning"
    INFO = "info"

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True, slots=True)
class Segment:
    """A contiguous run of elements in one file. A tensor is the concatenation of its segments."""

    file: str
    offset: int
    numel: int
    dtype: str

    @property
    def nbytes(self) -> int:
        return self.numel * itemsize(self.dtype)


@dataclass(frozen=True, slots=True)
class Strided:
    """`count` rows of a tensor in one record: row i is each part in turn, a part being its row-0 segment
    moved `stride` bytes on per row (a column-split shard's rows, a 2-D block's rows)."""

    count: int
    parts: tuple[tuple[Segment, int], ...]  # (row 0's segment, bytes from one row to the next)

    def segments(self, i: int) -> Iterator[Segment]:
        for seg, stride in self.parts:
            yield Segment(seg.file, seg.offset + i * stride, seg.numel, seg.dtype) if i else seg


class SegmentRecords(Sequence[Segment]):
    """A compact record read as the tuple of segments it stands for (`Runs`, `scan.slices.RankSlices`): equal
    to, and hashed as, that tuple, so every consumer compares it as it compares a tuple."""

    __slots__ = ()

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Sequence) or len(other) != len(self):
            return False
        return all(a == b for a, b in zip(self, other, strict=True))

    def __hash__(self) -> int:  # equal to the tuple of its segments, so hashed as that tuple
        return hash(tuple(self))


class Runs(SegmentRecords):
    """A tensor's segments kept as `Strided` records, read as the segments they stand for: a join of a
    million one-element rows is one record at rest, and every consumer walks it as it walks a tuple."""

    __slots__ = ("_ends", "blocks")

    def __init__(self, blocks: Sequence[Strided]) -> None:
        self.blocks = tuple(blocks)
        self._ends = tuple(accumulate(b.count * len(b.parts) for b in self.blocks))

    def __len__(self) -> int:
        return self._ends[-1] if self._ends else 0

    def __iter__(self) -> Iterator[Segment]:
        return self.iter_from(0)

    def iter_from(self, i: int) -> Iterator[Segment]:
        """The segments from index `i` on, found without walking the ones before it (a reader's chunk)."""
        if not 0 <= i < len(self):
            return
        k = bisect_right(self._ends, i)
        row, part = divmod(i - (self._ends[k - 1] if k else 0), len(self.blocks[k].parts))
        for b in self.blocks[k:]:
            for r in range(row, b.count):
                for seg, stride in b.parts[part:]:
                    yield Segment(seg.file, seg.offset + r * stride, seg.numel, seg.dtype) if r else seg
                part = 0
            row = 0

    def __getitem__(self, i: int | slice) -> Any:
        if isinstance(i, slice):
            r = range(len(self))[i]
            if r.step == 1:
                return tuple(islice(self, r.start, r.stop))
            return tuple(self[j] for j in r)
        if i < 0:
            i += len(self)
        if not 0 <= i < len(self):
            raise IndexError(i)
        k = bisect_right(self._ends, i)
        b = self.blocks[k]
        j = i - (self._ends[k - 1] if k else 0)
        row, part = divmod(j, len(b.parts))
        seg, stride = b.parts[part]
        return Segment(seg.file, seg.offset + row * stride, seg.numel, seg.dtype)

    def __repr__(self) -> str:
        return f"Runs({len(self.blocks)} records, {len(self):,} segments)"

    def __reduce__(self) -> tuple[Any, ...]:
        return (Runs, (self.blocks,))


@dataclass(frozen=True, slots=True)
class TensorInfo:
    """One tensor of the consolidated state dict, as zero_to_fp32 would return it (plus what it drops)."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    kind: Kind
    segments: tuple[Segment, ...]
    alias_of: str | None = None
    group: int | None = None
    moments: tuple[tuple[str, tuple[Segment, ...]], ...] = ()
    # stage 1/2 trainable params: the 16-bit copy in the model-states file (`module`), in the compute dtype
    module_copy: tuple[Segment, ...] = ()
    pad_after: int = 0  # stage 1/2: alignment padding elements right after it in the flat buffer
    stage: int | None = None  # pipeline: the stage whose files hold the master (reports name it)

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.numel * itemsize(self.dtype)

    @property
    def is_floating(self) -> bool:
        return self.dtype in FLOATING

    @property
    def module(self) -> str:
        """The submodule path (`layers.0.attn` for `layers.0.attn.q.weight`)."""
        return self.name.rpartition(".")[0]


@dataclass(frozen=True, slots=True)
class Finding:
    """Something a user should know about the checkpoint: what, which file, and what to do."""

    severity: Severity
    code: str
    message: str
    file: str | None = None
    hint: str = ""

    def as_dict(self) -> dict[str, Any]:
        return {
            "severity": str(self.severity),
            "code": self.code,
            "message": self.message,
            "file": self.file,
            "hint": self.hint,
        }


@dataclass(frozen=True, slots=True)
class FileInfo:
    path: str
    role: str  # "model" | "optim"
    size: int
    dp_rank: int | None
    mp_rank: int
    mtime_ns: int = 0  # with size, identifies this save of the file (a resumed conversion checks both)

    @classmethod
    def stat(
        cls,
        path: str,
        role: str,
        dp_rank: int | None,
        mp_rank: int = 0,
        source: ByteSource | None = None,
        known: tuple[int, int] | None = None,
    ) -> FileInfo:
        """The file's size and save time, asked of `source` (the checkpoint's; its folder's when None), or
        `known` already: the fstat of the open the scan read it through (`RankFiles.opened`)."""
        if known is not None:
            return cls(path, role, known[0], dp_rank, mp_rank, known[1])
        try:
            size, mtime_ns = (source or _folder_of(path)).size_and_mtime(path)
        except OSError:  # dangling link or vanished file: reported by the scan as unreadable
            return cls(path, role, 0, dp_rank, mp_rank, 0)
        return cls(path, role, size, dp_rank, mp_rank, mtime_ns)


@dataclass(frozen=True, slots=True)
class GroupInfo:
    """A parameter group (stage 1/2) or sub-group (stage 3) and how it is partitioned."""

    index: int
    param_count: int
    numel: int
    padded_numel: int
    partition_numel: int
    hyperparams: Mapping[str, Any] = field(default_factory=dict)
    alignment: int = 0  # padding elements between parameters (param_alignment_paddings), of padded - numel


@dataclass(frozen=True, slots=True)
class RankGroup:
    """One rank's share of one group: elements it stores, how many are padding: `padding` at the group's end
    (`group_paddings`), `alignment` between parameters (`param_alignment_paddings`) inside this partition."""

    group: int
    partition_numel: int
    stored_numel: int
    padding: int
    alignment: int = 0

    @property
    def pad_total(self) -> int:
        """Every padding element in this rank's partition, wherever it sits."""
        return self.padding + self.alignment

    @property
    def param_numel(self) -> int:
        """Elements of this partition that belong to parameters."""
        return self.partition_numel - self.pad_total


@dataclass(frozen=True, slots=True)
class RankInfo:
    rank: int
    optim_file: str | None
    model_file: str | None
    optim_bytes: int
    model_bytes: int
    groups: tuple[RankGroup, ...]


@dataclass(frozen=True, slots=True)
class Parallel:
    """How a model-parallel run split the model (FORMAT.md §3.6, §3.7): its degrees, which ranks hold what
    (`placement`, one `Holding` per stage, shard or MoE layer) and the layout in a few words (`words`, set by
    the layout that scanned it, e.g. `pipeline parallel: 2 stages x 2 data-parallel ranks`). Data-parallel-only
    checkpoints have none. Faces read `words` and `placement`; nothing branches on `kind`."""

    kind: str  # the layout's short name: "pipeline" | "expert" | "tensor"
    pp: int = 1
    ep: int = 1
    tp: int = 1
    dp: int = 1
    placement: tuple[Holding, ...] = ()
    autoep: bool = False  # experts fused by DeepSpeed's AutoEP (`ds_autoep_layers`), not native MoE modules
    # tensor parallel: the split the shards were joined by (the checkpoint's record, or the user's --tp-split),
    # read once by the scan; the universal kind writes its keys from it
    tp_recipe: TpRecipe | None = None
    words: str = ""

    @property
    def holders(self) -> tuple[tuple[str, str], ...]:
        """The placement in words, as (part, who holds it) rows such as ("stage 1", "layers 3-5 · ranks 1, 3"):
        the overview's rows and `scan --json`'s `holders`."""
        return tuple(holder_row(h, autoep=self.autoep) for h in self.placement)


@dataclass(frozen=True)
class Checkpoint:
    """A scanned checkpoint tag. `tensors` covers every tensor of the fp32 reconstruction, aliases included."""

    root: str
    tag: str
    tags: tuple[str, ...]
    tag_dir: str
    layout: str  # "deepspeed" | "hf-trainer" | "lightning" | "tag-dir"
    stage: int
    world_size: int
    optimizer: str
    compute_dtype: str
    master_dtype: str
    deepspeed_version: str | None
    global_steps: int | None
    global_samples: int | None
    optimizer_step: int | None
    loss_scale: float | None
    dynamic_loss_scale: bool | None
    files: tuple[FileInfo, ...]
    ranks: tuple[RankInfo, ...]
    groups: tuple[GroupInfo, ...]
    tensors: tuple[TensorInfo, ...]
    findings: tuple[Finding, ...]
    ds_config: DsConfig = field(default_factory=DsConfig)  # the run's config, parsed once (`parse/dsconfig`)
    other_runs: tuple[str, ...] = ()
    module_copy_bytes: int = 0  # the 16-bit `module` weights in the model-states file (0 under stage 3)
    parallel: Parallel | None = None  # pipeline / expert / tensor parallel runs: degrees and who holds what
    # what a universal checkpoint of it needs (experts, why DeepSpeed could not resume one), from its layout
    universal: UniversalNeeds = field(default_factory=UniversalNeeds)
    saved_by: str = ""  # who wrote it, in words, when not DeepSpeed (`PyTorch DCP (torchtitan)`)
    # CPU-seconds the scan took in this process (`scanner.scan` sets it): a run scans again before its first
    # byte, so preflight counts it (thousands of rank files cost seconds, `convert.calibrate`)
    scan_cpu: float = field(default=0.0, compare=False)

    def __post_init__(self) -> None:
        _refuse_control_characters(self)
        object.__setattr__(self, "_by_name", {t.name: t for t in self.tensors})

    @property
    def source(self) -> ByteSource:
        """The folder (or bucket prefix) every file of this checkpoint is read through (links and `..` out
        of it refused)."""
        from inspector.remote.roots import source_at  # lazily: a local scan loads no store code

        return source_at(self.root, "checkpoint")

    def tensor(self, name: str) -> TensorInfo:
        return self._by_name[name]  # type: ignore[attr-defined, no-any-return]

    @property
    def errors(self) -> tuple[Finding, ...]:
        return tuple(f for f in self.findings if f.severity is Severity.ERROR)

    @property
    def total_bytes(self) -> int:
        return sum(f.size for f in self.files)

    def count(self, kind: Kind) -> tuple[int, int]:
        """(tensors, elements) of one kind."""
        ts = [t for t in self.tensors if t.kind is kind]
        return len(ts), sum(t.numel for t in ts)


def _refuse_control_characters(ckpt: Checkpoint) -> None:
    """Names and labels that came from the checkpoint's pickles or folder names are printed by both faces and
    become safetensors keys. An ESC or BEL in one can only be crafted (PyTorch module and parameter names,
    DeepSpeed versions and optimizer classes never hold one) and would reach the user's terminal as escape
    codes: such a checkpoint is refused, as a pickle asking for an unknown class is."""
    fields = [("tensor name", t.name) for t in ckpt.tensors]
    fields += [("tag", t) for t in (ckpt.tag, *ckpt.tags)]
    fields += [("DeepSpeed version", ckpt.deepspeed_version or ""), ("optimizer", ckpt.optimizer)]
    for what, value in fields:
        if has_unsafe(value):
            raise UnsafePickleError(
                f"{shown(ckpt.tag_dir)}: a {what}, {value!a}, holds "
                "control characters (terminal escape codes). "
                "No training run writes such a name. Nothing was executed or written.",
                hint="Treat the checkpoint as crafted; copy it again from a source you trust.",
            )


def _folder_of(path: str) -> ByteSource:
    """The byte source of a file's own folder or prefix, for a caller that named no source."""
    from inspector.remote.roots import parent_source  # lazily: a local scan loads no store code

    return parent_source(path)
