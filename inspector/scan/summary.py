"""Plain-data views of a Checkpoint for any front end (CLI, TUI): summary, contents, ranks, modules and
findings (`scan --json` is `json_view`)."""

from __future__ import annotations

import os
import re
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from inspector.format.dtypes import SHORT_NAMES
from inspector.scan.model import Checkpoint, Kind, RankInfo, Severity, TensorInfo
from inspector.scan.slices import segments_nbytes
from inspector.system.source import Source
from inspector.system.units import format_bytes, format_count, plural

_INDEX = re.compile(r"\.\d+(?=\.|$)")


def module_key(name: str) -> str:
    """`model.layers.12.mlp.up_proj.weight` -> `model.layers.*.mlp` (repeated blocks collapse)."""
    return _INDEX.sub(".*", name.rpartition(".")[0]) or "(root)"


def read_bytes_by_source(ckpt: Checkpoint) -> dict[str, int]:
    """Bytes a full conversion to the compute dtype reads from the checkpoint: from the fp32 masters, or with
    `--source module` (the 16-bit module copy of stage-1/2 trainable params, where there is one). A tied weight
    is read once, as an HF model folder (tied embeddings) or `--dedupe-tied` write it; the preflight of a
    weights file that repeats it under its second name counts that read too."""
    stored = [t for t in ckpt.tensors if t.alias_of is None]  # a tied alias's segments are its owner's
    masters = sum(segments_nbytes(t.segments) for t in stored)
    module = sum(segments_nbytes(t.module_copy if t.module_copy else t.segments) for t in stored)
    return {"masters": masters, "module": module}


def parameter_count(ckpt: Checkpoint) -> int:
    """The model's parameters: trainable and frozen, a tied alias once (it is its owner), buffers not."""
    return ckpt.count(Kind.TRAINABLE)[1] + ckpt.count(Kind.FROZEN)[1]


def saved_at(ckpt: Checkpoint) -> float | None:
    """When the tag was saved (seconds since the epoch): the newest rank file's modification time, which the
    scan recorded; failing that the tag folder's, read through the checkpoint's `Source` (so a link leading
    out of the checkpoint is not followed). None when neither is known."""
    newest = max((f.mtime_ns for f in ckpt.files), default=0)
    if newest:
        return newest / 1e9
    source = ckpt.source
    if not isinstance(source, Source):  # a bucket prefix has no time of its own, only its objects do
        return None
    if source.kind(ckpt.tag_dir) != "dir":  # missing, or a link out of the checkpoint
        return None
    st = source.lstat(ckpt.tag_dir)
    return st.st_mtime if st is not None else None


@dataclass(frozen=True)
class SummaryRow:
    """One line of the checkpoint summary: `key` names the row for the faces (to pick or style it), `label`
    and `value` are what they show, `note` is secondary text a face may dim after the value."""

    key: str
    label: str
    value: str
    note: str = ""


def summary_rows(ckpt: Checkpoint, *, short_dtypes: bool = False) -> list[SummaryRow]:
    """What this checkpoint is, row by row: where and which tag, ZeRO stage/ranks/optimizer, dtypes, the 16-bit
    module copy, training steps, loss scale (when saved), DeepSpeed version and files. `short_dtypes` writes
    bf16/fp32 for bfloat16/float32 (the TUI's narrower columns)."""

    def dt(name: str) -> str:
        return SHORT_NAMES.get(name, name) if short_dtypes else name

    tags = ", ".join(ckpt.tags[-6:]) + (f" (+{len(ckpt.tags) - 6} older)" if len(ckpt.tags) > 6 else "")
    dcp = ckpt.saved_by  # not DeepSpeed's (a PyTorch DCP folder): no ZeRO stage, no DeepSpeed, no module copy
    rows = [
        SummaryRow("root", "Checkpoint", ckpt.root, f"({ckpt.layout})"),
        SummaryRow("tag", "Tag", ckpt.tag, f"tags: {tags}"),
        SummaryRow(
            "zero",
            "Saved by" if dcp else "ZeRO",
            f"{dcp} · {plural(ckpt.world_size, 'rank')} · {ckpt.optimizer}"
            if dcp
            else f"stage {ckpt.stage} · {plural(ckpt.world_size, 'rank')} · {ckpt.optimizer}",
        ),
        *_parallel_rows(ckpt),
        SummaryRow("dtypes", "Dtypes", f"compute {dt(ckpt.compute_dtype)} · master {dt(ckpt.master_dtype)}"),
    ]
    if not dcp:
        rows.append(SummaryRow("module_copy", "Module copy", _module_copy_text(ckpt, dt(ckpt.compute_dtype))))
    steps = []
    if ckpt.global_steps is not None:
        steps.append(f"global step {ckpt.global_steps}")
    if ckpt.optimizer_step is not None:
        steps.append(f"optimizer step {ckpt.optimizer_step}")
    if ckpt.global_samples is not None:
        steps.append(f"{format_count(ckpt.global_samples)} samples")
    rows.append(SummaryRow("training", "Training", " · ".join(steps) or "–"))
    if ckpt.loss_scale is not None:
        dynamic = " (dynamic)" if ckpt.dynamic_loss_scale else ""
        rows.append(SummaryRow("loss_scale", "Loss scale", f"{ckpt.loss_scale:g}{dynamic}"))
    if not dcp:
        rows.append(SummaryRow("deepspeed", "DeepSpeed", ckpt.deepspeed_version or "unknown"))
    rows.append(SummaryRow("files", "Files", f"{len(ckpt.files)} files · {format_bytes(ckpt.total_bytes)}"))
    return rows


def _parallel_rows(ckpt: Checkpoint) -> list[SummaryRow]:
    """A model-parallel run's layout (degrees) and, per stage or expert-parallel rank, what it holds."""
    par = ckpt.parallel
    if par is None:
        return []
    shown = par.holders[:8]
    more = f" (+{len(par.holders) - 8} more)" if len(par.holders) > 8 else ""
    return [SummaryRow("parallel", "Layout", par.words)] + [
        SummaryRow(f"holds_{i}", "", f"{part}: {where}", more if i == len(shown) - 1 else "")
        for i, (part, where) in enumerate(shown)
    ]


def _module_copy_text(ckpt: Checkpoint, compute: str) -> str:
    if not ckpt.module_copy_bytes and ckpt.stage == 0 and ckpt.compute_dtype == "float32":
        return "none (fp32 training with ZeRO off: the module's weights are the masters)"
    if not ckpt.module_copy_bytes:
        if ckpt.stage == 0:  # fp32 without ZeRO: the optimizer steps the module's own weights
            return "none (ZeRO off in fp32: the saved weights are the masters)"
        return "none (stage 3 saves placeholders; the masters are the only full copy)"
    text = f"{format_bytes(ckpt.module_copy_bytes)} of {compute} weights beside the fp32 masters"
    by = read_bytes_by_source(ckpt)
    if by["module"] < by["masters"]:
        text += (
            f"; a {compute} conversion reads {format_bytes(by['masters'])} from the masters, "
            f"{format_bytes(by['module'])} with --source module"
        )
    return text


@dataclass(frozen=True)
class KindTotal:
    """The tensors of one kind: how many, their elements, their bytes at their own dtype (`nbytes`, as in
    `scan --json`) and the bytes of their segments in the files (`stored_bytes`). A tied alias's segments are
    its owner's, so its bytes are not stored twice; the contents rows show none for it."""

    kind: Kind
    tensors: int
    numel: int
    nbytes: int
    stored_bytes: int


def kind_totals(ckpt: Checkpoint) -> list[KindTotal]:
    """One KindTotal per kind present, in Kind order."""
    out = []
    for kind in Kind:
        n, numel = ckpt.count(kind)
        if n:
            ts = [t for t in ckpt.tensors if t.kind is kind]
            stored = sum(segments_nbytes(t.segments) for t in ts)
            out.append(KindTotal(kind, n, numel, sum(t.nbytes for t in ts), stored))
    return out


@dataclass(frozen=True)
class ContentsRow:
    """A row of the contents table (what / tensors / params / bytes). `what` is the label; `key` is what the
    row counts, for styling: a Kind's value ("trainable", "frozen", "buffer", "tied"), "moment",
    "module_copy" or "padding". A figure is None where the row has none: the moments and the module copy
    count bytes only, padding elements only, and a tied alias has no bytes of its own."""

    key: str
    what: str
    tensors: int | None
    numel: int | None
    nbytes: int | None


def contents_rows(ckpt: Checkpoint, *, short_dtypes: bool = False) -> list[ContentsRow]:
    """Where the checkpoint's bytes are: the fp32 masters and the other kinds (bytes as stored), each optimizer
    moment (Adam exp_avg, exp_avg_sq), the 16-bit module copy and the partition padding (elements)."""
    rows = []
    for k in kind_totals(ckpt):
        what = str(k.kind)
        if k.kind is Kind.TRAINABLE:
            what = "fp32 masters" if ckpt.master_dtype == "float32" else "masters"
        nbytes = None if k.kind is Kind.TIED else k.stored_bytes
        rows.append(ContentsRow(str(k.kind), what, k.tensors, k.numel, nbytes))
    moments: dict[str, int] = {}
    for x in ckpt.tensors:
        if x.kind is Kind.TIED:  # an alias shares its owner's optimizer state
            continue
        for state, segs in x.moments:
            moments[state] = moments.get(state, 0) + sum(s.nbytes for s in segs)
    rows += [ContentsRow("moment", f"Adam {state}", None, None, nbytes) for state, nbytes in moments.items()]
    if ckpt.module_copy_bytes:
        compute = (
            SHORT_NAMES.get(ckpt.compute_dtype, ckpt.compute_dtype) if short_dtypes else ckpt.compute_dtype
        )
        rows.append(ContentsRow("module_copy", f"{compute} module copy", None, None, ckpt.module_copy_bytes))
    align = sum(alignment_padding(ckpt).values())
    pad = sum(g.padding for r in ckpt.ranks for g in r.groups) + align
    if pad:
        what = f"padding ({align:,} align)" if align else "padding"
        rows.append(ContentsRow("padding", what, None, pad, None))
    return rows


def alignment_padding(ckpt: Checkpoint) -> dict[tuple[int, int], int]:
    """{(rank, group): elements} of `param_alignment_paddings` in each rank's partition (stage 1/2): the
    padding *between* parameters, which `group_paddings` (the end of the last partition) does not count.
    Read from `RankGroup.alignment`, which the layout computes once from the files; every view (overview,
    ranks table, tensor detail, `scan`) takes it from here, so none can disagree."""
    return {(r.rank, g.group): g.alignment for r in ckpt.ranks for g in r.groups if g.alignment}


@dataclass(frozen=True)
class RankRow:
    """One rank file set: its index, file names (basenames, optimizer file first), bytes, and per group the
    stored elements and padding; `complete` is False when its optimizer-states file is missing."""

    rank: int
    files: tuple[str, ...]
    nbytes: int
    groups: tuple[tuple[int, int], ...]  # (stored_numel, padding) per group
    complete: bool
    alignment: tuple[int, ...] = ()  # per group: alignment padding between parameters in this partition
    group_index: tuple[int, ...] = ()  # the group of each entry (a pipeline stage or an expert-parallel rank
    # holds only some groups): cells are placed by it

    @property
    def padding(self) -> int:
        return sum(pad for _, pad in self.groups) + sum(self.alignment)

    @property
    def group_cells(self) -> list[str]:
        """`stored / padding` per group, as both faces show it (`991,004 / 1`); with alignment padding between
        parameters, `end+alignment` (`8,327 / 3+74`)."""
        align = self.alignment or (0,) * len(self.groups)
        texts = [
            f"{format_count(stored)} / {pad}" + (f"+{a}" if a else "")
            for (stored, pad), a in zip(self.groups, align, strict=True)
        ]
        if not self.group_index or self.group_index == tuple(range(len(texts))):
            return texts
        cells = [""] * (max(self.group_index) + 1)
        for i, text in zip(self.group_index, texts, strict=True):
            cells[i] = text
        return cells


def rank_row(r: RankInfo) -> RankRow:
    """One rank's row: end padding (`group_paddings`) and alignment padding between parameters per group."""
    return RankRow(
        rank=r.rank,
        files=tuple(os.path.basename(p) for p in (r.optim_file, r.model_file) if p),
        nbytes=r.optim_bytes + r.model_bytes,
        groups=tuple((g.stored_numel, g.padding) for g in r.groups),
        complete=bool(r.optim_file),
        alignment=tuple(g.alignment for g in r.groups),
        group_index=tuple(g.group for g in r.groups),
    )


@dataclass
class ModuleRow:
    module: str
    tensors: int = 0
    numel: int = 0
    nbytes: int = 0
    kinds: dict[str, int] = field(default_factory=dict)
    dtypes: set[str] = field(default_factory=set)


def module_rows(tensors: tuple[TensorInfo, ...]) -> list[ModuleRow]:
    rows: OrderedDict[str, ModuleRow] = OrderedDict()
    for t in tensors:
        row = rows.setdefault(module_key(t.name), ModuleRow(module_key(t.name)))
        row.tensors += 1
        row.numel += t.numel
        row.nbytes += t.nbytes
        row.kinds[str(t.kind)] = row.kinds.get(str(t.kind), 0) + 1
        row.dtypes.add(t.dtype)
    return list(rows.values())


class FindingLike(Protocol):
    """What both kinds of finding have (`scan.model.Finding`, `health.HealthFinding`)."""

    @property
    def severity(self) -> Severity: ...

    @property
    def message(self) -> str: ...

    @property
    def hint(self) -> str: ...


@dataclass(frozen=True)
class FindingLine:
    """One finding as a face shows it: `file` and `hint` empty where they would repeat a neighbour's."""

    severity: Severity
    message: str
    file: str
    hint: str


def finding_lines(items: Sequence[FindingLike], shown_max: int) -> tuple[list[FindingLine], int]:
    """The findings both faces show, errors first (stable: each kind's own order kept), and how many more
    there are past `shown_max`. A file (scan findings name one) is given where it changes and a hint once
    for a run of findings sharing it: 128 missing rank files are not 128 copies of "copy the folder"."""
    order = list(Severity)
    shown = sorted(items, key=lambda f: order.index(f.severity))[:shown_max]
    lines = []
    for i, f in enumerate(shown):
        file = getattr(f, "file", None) or ""
        if i and (getattr(shown[i - 1], "file", None) or "") == file:
            file = ""
        hint = f.hint if i + 1 == len(shown) or shown[i + 1].hint != f.hint else ""
        lines.append(FindingLine(f.severity, f.message, file, hint))
    return lines, len(items) - len(shown)
