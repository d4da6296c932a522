"""Who holds what in a model-parallel checkpoint, as data, and its one wording.

The scanners fill `Parallel.placement` with `Holding` rows (an MoE layer's experts, a pipeline stage, a
tensor-parallel shard, a pipeline stage's shard); the overview, `scan --json`'s `holders` and the app's tree
all start from these rows, and `holder_row` is the only place that turns one into words. Nothing here imports
the rest of the scan, so the model can hold the rows and still render them."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

TIED_PREFIX = "tied_modules."  # where DeepSpeed's PipelineModule registers tied modules (FORMAT.md §3.6)


@dataclass(frozen=True, slots=True)
class ExpertSpan:
    """Global experts of one MoE layer and the global ranks holding them: one expert-parallel rank's share
    (its expert-data-parallel group); `ranks` empty where no rank recorded that expert-parallel rank."""

    experts: tuple[int, ...]
    ranks: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Holding:
    """One part of a model-parallel checkpoint and the global ranks holding it: an MoE layer (`module`, its
    experts module path, and `experts`), a pipeline stage (`stage`, the parameter `layers` and `tied` module
    keys whose masters its optimizer files hold), a tensor-parallel shard (`shard`), or both for a pipeline
    stage's shard."""

    module: str = ""
    experts: tuple[ExpertSpan, ...] = ()
    stage: int | None = None
    shard: int | None = None
    layers: tuple[int, ...] = ()
    tied: tuple[str, ...] = ()
    ranks: tuple[int, ...] = ()

    @property
    def stage_modules(self) -> tuple[str, ...]:
        """The module paths a pipeline stage's row covers, as the pipeline module names them: each layer by its
        index (`4`), each tied module under `tied_modules.` (`tied_modules.embed`)."""
        return tuple(str(i) for i in self.layers) + tuple(TIED_PREFIX + k for k in self.tied)


def expert_spans(by_expert: Mapping[int, Sequence[int]]) -> tuple[ExpertSpan, ...]:
    """Native MoE's experts grouped by the ranks that hold them (each group an expert-parallel rank's)."""
    by_ranks: dict[tuple[int, ...], list[int]] = {}
    for expert, held in sorted(by_expert.items()):
        by_ranks.setdefault(tuple(held), []).append(expert)
    return tuple(ExpertSpan(tuple(experts), ranks) for ranks, experts in by_ranks.items())


def ranges(values: Sequence[int]) -> str:
    """`0-2, 5` for [0, 1, 2, 5] (sorted input)."""
    runs: list[list[int]] = []
    for v in values:
        if runs and v == runs[-1][1] + 1:
            runs[-1][1] = v
        else:
            runs.append([v, v])
    return ", ".join(f"{a}-{b}" if a != b else f"{a}" for a, b in runs)


def holder_row(h: Holding, *, autoep: bool = False) -> tuple[str, str]:
    """(part, who holds it) as the overview and `scan --json` print it: ("stage 1", "layers 3-5 · ranks 1, 3"),
    ("shard 0", "ranks 0, 2"), ("m.experts", "experts 0-1: ranks 0, 2 · experts 2-3: ranks 1, 3").
    `autoep`: AutoEP's rows say `expert 3` for a lone expert; native MoE's have always said `experts 3`."""
    if h.stage is None and h.shard is None:
        return h.module, " · ".join(_span_words(s, autoep) for s in h.experts)
    parts = ([f"stage {h.stage}"] if h.stage is not None else []) + (
        [f"shard {h.shard}"] if h.shard is not None else []
    )
    who = f"ranks {', '.join(map(str, h.ranks)) or '–'}"
    if h.stage is None:
        return " · ".join(parts), who
    what = (
        f"{'layer' if len(h.layers) == 1 else 'layers'} {ranges(h.layers)}"
        if h.layers
        else "no parameter layers"
    )
    tied = f" · tied {', '.join(h.tied)}" if h.tied else ""
    return " · ".join(parts), f"{what}{tied} · {who}"


def _span_words(s: ExpertSpan, autoep: bool) -> str:
    """`experts 0-1: ranks 0, 2`; experts that are not one run are listed (`experts 0, 2: rank 0`)."""
    e = s.experts
    run = len(e) > 1 and list(e) == list(range(e[0], e[-1] + 1))
    which = f"{e[0]}-{e[-1]}" if run else ", ".join(map(str, e))
    noun = "experts" if len(e) > 1 or not autoep else "expert"
    who = ", ".join(map(str, s.ranks)) or "none"
    return f"{noun} {which}: rank{'s' if len(s.ranks) > 1 else ''} {who}"


__all__ = ["TIED_PREFIX", "ExpertSpan", "Holding", "expert_spans", "holder_row", "ranges"]
