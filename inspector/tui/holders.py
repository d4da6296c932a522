"""Who holds which module of a model-parallel checkpoint, for the tensor tree: each expert under its global
index with the ranks holding it, each pipeline layer with its stage and ranks.

It reads the scan's structured rows (`Parallel.placement`: scan/holding.Holding), never the scan's words; an
MoE layer's own module row shows the overview's words for that layer (scan/holding.holder_row).
tests/tui/test_layout_tree.py pins the tree on every committed layout fixture."""

from __future__ import annotations

from collections.abc import Iterable

from inspector.scan.holding import holder_row, ranges
from inspector.scan.model import Parallel


def span(values: Iterable[int]) -> str:
    """[0, 1, 2, 5] in any order, repeats allowed -> `0-2, 5`: the scan's own `ranges`, so the tree writes
    ranks and layers as the overview does."""
    return ranges(sorted(set(values)))


def _ranks_words(ranks: Iterable[int]) -> str:
    """`rank 2`, `ranks 0-3`, or `no rank` where none recorded it."""
    held = set(ranks)
    return f"rank{'s' if len(held) > 1 else ''} {span(held)}" if held else "no rank"


def _expert_rows(par: Parallel) -> dict[str, str]:
    """Each MoE layer's experts module -> its overview row; each expert (`<module>.<e>`) -> its ranks."""
    out: dict[str, str] = {}
    for h in par.placement:
        if not h.module:  # a stage or shard row
            continue
        out[h.module] = holder_row(h, autoep=par.autoep)[1]
        for s in h.experts:
            for e in s.experts:
                out[f"{h.module}.{e}"] = f"expert {e} · {_ranks_words(s.ranks)}"
    return out


def _stage_rows(par: Parallel) -> dict[str, str]:
    """Each pipeline layer and tied module -> the stages (a tied module is on several) and their ranks,
    every tensor-parallel shard of a stage counted."""
    stages: dict[str, set[int]] = {}
    ranks: dict[str, set[int]] = {}
    for h in par.placement:
        if h.stage is None:
            continue
        for p in h.stage_modules:
            stages.setdefault(p, set()).add(h.stage)
            ranks.setdefault(p, set()).update(h.ranks)
    return {
        p: f"stage{'s' if len(s) > 1 else ''} {span(s)} · {_ranks_words(ranks[p])}" for p, s in stages.items()
    }


def module_holders(par: Parallel | None) -> dict[str, str]:
    """Module path -> who holds it, in words: `expert 3 · ranks 1, 3`, `stage 1 · ranks 2-3`; an MoE layer's
    experts module (AutoEP's fused experts too) -> its whole row. Each row of the placement says what it is (an
    MoE layer's experts, a pipeline stage), so a layout that has both (pipeline x MoE) shows both."""
    if par is None:
        return {}
    return {**_stage_rows(par), **_expert_rows(par)}
