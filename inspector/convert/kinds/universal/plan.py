"""The plan of a DeepSpeed universal checkpoint: every file, from which bytes, fixed before any byte is written.

Layout (FORMAT.md §4): `OUT/<tag>_uni/zero/<param>/{fp32,exp_avg,exp_avg_sq}.pt` as
`{'param': fp32 tensor in full shape, 'cat_dim': 0}`, a `step.pt` per parameter for stage 1/2, one
`zero/optimizer_state.pt` with the global optimizer state and hyperparameters, byte copies of the
model-states files, and `OUT/latest_universal` naming the folder. Every parameter is rebuilt from
`param_shapes` (so round-robin and aligned layouts come out right, unlike `ds_to_universal`).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from inspector.errors import DamagedCheckpointError, OutputError, UnsupportedCheckpointError
from inspector.scan.model import Checkpoint, Kind, Segment
from inspector.system.bytesource import ByteSource
from inspector.system.source import open_in

STATES = ("fp32", "exp_avg", "exp_avg_sq")
# zip entries, pickle and directory of one `.pt` file: measured 1,784 B + 7 B per character of the state name
# (each of the 7 entries repeats it twice) within 64 B of alignment; a step.pt ~1,760 B
FILE_OVERHEAD = 1_784
SMALL_FILE = 1_760
OPTIMIZER_STATE_ESTIMATE = 4_096
LATEST = "latest_universal"


@dataclass(frozen=True, slots=True)
class UniFile:
    """One per-parameter `.pt` file: `{'param': <shape> tensor, 'cat_dim': 0}` streamed from `segments`."""

    rel: str  # path inside the universal folder, e.g. "zero/l1.weight/exp_avg.pt"
    name: str
    state: str
    shape: tuple[int, ...]
    source_dtype: str
    segments: tuple[Segment, ...]
    meta: tuple[tuple[str, Any], ...] = (("cat_dim", 0),)  # the keys beside `param` (layouts.py)

    @property
    def nbytes(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n * 4  # written as fp32


@dataclass(frozen=True, slots=True)
class UniversalPlan:
    """Everything the writer will do, fixed before any byte is written."""

    out_root: str
    folder: str  # "<tag>_uni"
    stage: int
    files: tuple[UniFile, ...]
    step_params: tuple[tuple[str, int], ...]  # stage 1/2: (param name, group) -> zero/<name>/step.pt
    copies: tuple[tuple[str, str, int], ...]  # (source path, name in the folder, size): model-states files
    optim_file: str  # rank 0's optimizer file: global state, hyperparameters and steps
    source: tuple[tuple[str, int, int], ...]  # (path, size, mtime_ns) of every source file
    sources: tuple[ByteSource, ...] = ()  # the folders (or prefixes) the source files are read through
    # per step_params entry: the optimizer file holding that parameter (a pipeline stage's, not rank 0's)
    step_files: tuple[str, ...] = ()
    # what scanning the checkpoint cost here (`Checkpoint.scan_cpu`): part of the run's start-up
    scan_cpu: float = field(default=0.0, compare=False)

    @property
    def out_dir(self) -> str:
        return os.path.join(self.out_root, self.folder)

    @property
    def tensor_bytes(self) -> int:
        return sum(f.nbytes for f in self.files)

    @property
    def file_count(self) -> int:
        """Every file the export writes (tensor states, step counts, optimizer state, model-states copies)."""
        return sum(1 for _ in iter_rel_paths(self))

    def planned_sizes(self) -> dict[str, int]:
        """Every file's size as planned, by its path in the folder (the small files' sizes are estimates, the
        same ones `total_bytes` adds up; the copies' sizes are the scan's)."""
        sizes = {f.rel: f.nbytes + FILE_OVERHEAD + 7 * len(f.state) for f in self.files}
        sizes |= {f"zero/{name}/step.pt": SMALL_FILE for name, _ in self.step_params}
        sizes |= {name: size for _, name, size in self.copies}
        sizes["zero/optimizer_state.pt"] = OPTIMIZER_STATE_ESTIMATE
        return sizes

    @property
    def total_bytes(self) -> int:
        copies = sum(size for _, _, size in self.copies)
        overhead = sum(FILE_OVERHEAD + 7 * len(f.state) for f in self.files)
        small = len(self.step_params) * SMALL_FILE + OPTIMIZER_STATE_ESTIMATE
        return self.tensor_bytes + copies + overhead + small


def plan_universal(ckpt: Checkpoint, out_root: str, folder: str | None = None) -> UniversalPlan:
    """Pure: which files, from which bytes. Frozen params get an fp32 copy (as ds_to_universal's stage-1/2
    path writes); buffers and tied aliases live in the copied model-states files."""
    if ckpt.errors:  # --force does not reach here: the kind's offer says it cannot convert a damaged one
        raise DamagedCheckpointError(
            f"{ckpt.tag_dir} has {len(ckpt.errors)} error finding(s); see `zero-inspector scan`.",
            hint="A universal checkpoint written from a damaged source would resume wrong; --force does not "
            "apply to --format universal.",
        )
    from inspector.convert.kinds.universal.layouts import layout_metadata, universal_view

    tensors = universal_view(ckpt)  # native MoE: one stacked tensor per layer and local expert slot
    meta = layout_metadata(ckpt, tensors)
    files: list[UniFile] = []
    steps: list[tuple[str, int]] = []
    step_files: list[str] = []
    optim0 = ckpt.ranks[0].optim_file if ckpt.ranks else None
    for t in tensors:
        if t.kind is Kind.TRAINABLE:
            moments = dict(t.moments)
            if set(moments) != {"exp_avg", "exp_avg_sq"}:
                raise UnsupportedCheckpointError(
                    f"{t.name} has no Adam moments (exp_avg, exp_avg_sq) in the optimizer state.",
                    hint="Universal checkpoints are written for Adam-family optimizers only.",
                )
            for state, segs in (("fp32", t.segments), *((m, moments[m]) for m in STATES[1:])):
                files.append(_file(t.name, state, t.shape, segs, meta.get(t.name)))
            if ckpt.stage < 3:
                steps.append((t.name, t.group or 0))
                step_files.append(t.segments[0].file if t.segments else optim0 or "")
        elif t.kind is Kind.FROZEN:
            files.append(_file(t.name, "fp32", t.shape, t.segments, meta.get(t.name)))
    if optim0 is None:
        raise DamagedCheckpointError(f"{ckpt.tag_dir}: the rank-0 optimizer file is missing.")
    copies = tuple((f.path, os.path.basename(f.path), f.size) for f in ckpt.files if f.role == "model")
    return UniversalPlan(
        out_root=os.path.abspath(out_root),
        folder=folder or f"{ckpt.tag}_uni",
        stage=ckpt.stage,
        files=tuple(files),
        step_params=tuple(steps),
        copies=copies,
        optim_file=optim0,
        source=tuple((f.path, f.size, f.mtime_ns) for f in ckpt.files),
        sources=(ckpt.source,),
        step_files=tuple(step_files),
        scan_cpu=ckpt.scan_cpu,
    )


def _file(
    name: str,
    state: str,
    shape: tuple[int, ...],
    segs: tuple[Segment, ...],
    meta: tuple[tuple[str, Any], ...] | None = None,
) -> UniFile:
    dtype = segs[0].dtype if segs else "float32"
    if dtype not in ("float32", "bfloat16", "float16"):
        raise UnsupportedCheckpointError(f"{name}: {state} is stored as {dtype}; expected a float dtype.")
    if meta is None:
        return UniFile(f"zero/{name}/{state}.pt", name, state, shape, dtype, segs)
    return UniFile(f"zero/{name}/{state}.pt", name, state, shape, dtype, segs, meta)


def prepare(plan: UniversalPlan, overwrite: bool) -> None:
    """Refuse to replace an existing universal folder or a different `latest_universal` without --overwrite."""
    latest = os.path.join(plan.out_root, LATEST)
    clash = []
    if os.path.lexists(plan.out_dir):
        clash.append(plan.out_dir)
    if os.path.lexists(latest):
        try:
            same = os.path.isfile(latest) and _read_latest(latest) == plan.folder
        except OSError:
            same = False
        if not same:
            clash.append(latest)
    if clash and not overwrite:
        raise OutputError(
            f"{' and '.join(clash)} already exist{'s' if len(clash) == 1 else ''}.",
            hint="Pass --overwrite to replace them, or choose another output folder.",
        )
    if os.path.lexists(plan.out_dir) and (
        os.path.islink(plan.out_dir) or not os.path.isdir(os.path.join(plan.out_dir, "zero"))
    ):
        raise OutputError(
            f"{plan.out_dir} exists and is not a universal checkpoint; not replacing it.",
            hint="Move it away or choose another output folder.",
        )


def _read_latest(path: str) -> str:
    fd = open_in(path)
    try:
        return os.pread(fd, 4096, 0).decode("utf-8", "replace").strip()
    finally:
        os.close(fd)


def iter_rel_paths(plan: UniversalPlan) -> Iterator[str]:
    """Every file the plan writes, relative to the universal folder (for verify and tests)."""
    yield "zero/optimizer_state.pt"
    for f in plan.files:
        yield f.rel
    for name, _ in plan.step_params:
        yield f"zero/{name}/step.pt"
    for _, name, _ in plan.copies:
        yield name
