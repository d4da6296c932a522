"""What the health pass reads: one job per stream to reduce (with the streams read in step with it), and
the row each gives."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from inspector.health.stats import Stats
from inspector.scan.model import Checkpoint, Kind, Segment, TensorInfo
from inspector.scan.slices import segments_nbytes


@dataclass(frozen=True, slots=True)
class Job:
    """One stream to reduce (plus, for masters, the streams read in step with it)."""

    name: str
    source: str  # master | exp_avg | exp_avg_sq | frozen | buffer
    shape: tuple[int, ...]
    segments: tuple[Segment, ...]
    module: tuple[Segment, ...] = ()
    against: tuple[Segment, ...] = ()
    zero_rows: bool = False

    @property
    def nbytes(self) -> int:
        return sum(segments_nbytes(s) for s in (self.segments, self.module, self.against))

    @property
    def numel(self) -> int:
        """Elements of the stream (a stage-3 parameter's `RankSlices` knows its own)."""
        n = getattr(self.segments, "numel", None)
        return n if isinstance(n, int) else sum(s.numel for s in self.segments)


@dataclass(frozen=True, slots=True)
class Row:
    """The statistics of one source of one tensor (the unit of the report's `tensors` list)."""

    name: str
    source: str
    shape: tuple[int, ...]
    dtype: str
    stats: Stats
    module_max_diff: float | None = None  # module rows: largest |module - master cast to module dtype|
    module_differing: int | None = None
    delta_norm: float | None = None  # master rows with `against`: ||master - master_against||
    against_norm: float | None = None  # moment rows with `against`: the same moment's L2 norm in that tag
    against_nonfinite: int | None = None  # master rows with `against`: NaN and Inf in that tag's master
    where: str = ""  # where the checkpoint keeps it, when the name alone does not say (`pipeline stage 1`)

    @property
    def module(self) -> str:
        return self.name.rpartition(".")[0]

    @property
    def label(self) -> str:
        """The name as findings write it: `4.weight (pipeline stage 1)`, or the name alone."""
        return f"{self.name} ({self.where})" if self.where else self.name

    @property
    def delta_rel(self) -> float | None:
        """The change relative to the tensor's norm in this tag."""
        if self.delta_norm is None:
            return None
        if self.stats.norm:
            return self.delta_norm / self.stats.norm
        return 0.0 if self.delta_norm == 0 else float("inf")


def plan_jobs(ckpt: Checkpoint, tensors: Sequence[TensorInfo], against: Checkpoint | None) -> list[Job]:
    """The streams of the selected tensors. Tied aliases are read once, under their owner's name (the alias
    itself only when its owner is not selected)."""
    chosen = {t.name for t in tensors}
    jobs: list[Job] = []
    for t in tensors:
        if t.kind is Kind.TIED and t.alias_of in chosen:
            continue
        if t.kind in (Kind.TRAINABLE, Kind.TIED):
            other: tuple[Segment, ...] = ()
            o = None
            if against is not None:
                o = _by_name(against, t.alias_of if t.kind is Kind.TIED and t.alias_of else t.name)
                if o is not None and tuple(o.shape) == tuple(t.shape) and o.segments:  # (23, 70) is no (70, 23)
                    other = o.segments
            module = t.module_copy if sum(s.numel for s in t.module_copy) == t.numel else ()
            jobs.append(Job(t.name, "master", t.shape, t.segments, module, other))
            then = dict(o.moments) if other and o is not None else {}
            for moment, segs in t.moments:
                prior = then.get(moment, ())
                if sum(s.numel for s in prior) != t.numel:
                    prior = ()
                jobs.append(
                    Job(t.name, moment, t.shape, segs, against=prior, zero_rows=moment == "exp_avg_sq")
                )
        else:
            jobs.append(Job(t.name, "frozen" if t.kind is Kind.FROZEN else "buffer", t.shape, t.segments))
    return [j for j in jobs if j.segments or not j.shape]


def _by_name(ckpt: Checkpoint, name: str) -> TensorInfo | None:
    try:
        return ckpt.tensor(name)
    except KeyError:
        return None


__all__ = ["Job", "Row", "plan_jobs"]
