"""Who holds which module of a model-parallel checkpoint, for the tensor tree: each expert under its global
index with the ranks holding it, each pipeline layer with its stage and ranks.

The scan words this in `Parallel.holders` (the overview's rows, `scan --json`'s `holders`): per MoE layer
"experts 0-1: ranks 0, 2 · experts 2-3: ranks 1, 3" (scan/moe.holder_text, scan/autoep_place.ranks_text), per
stage "layers 1-2 · tied embed · ranks 0, 1" (scan/pipeline). This reads those rows back into module paths;
tests/tui/test_layout_tree.py pins it on every committed layout fixture, so a change of wording fails there."""

from __future__ import annotations

import re

from inspector.scan.model import Parallel
from inspector.scan.pipeline_names import ranges

_EXPERTS = re.compile(r"experts? (?P<which>[\d, -]+): ranks? (?P<who>[\d, ]+|none)$")
_LAYERS = re.compile(r"layers? (?P<which>[\d, -]+)$")
_TIED = re.compile(r"tied (?P<keys>.+)$")
_RANKS = re.compile(r"ranks? (?P<who>[\d, ]+)$")
_STAGE = re.compile(r"stage (?P<stage>\d+)")


def numbers(text: str) -> list[int]:
    """`0-2, 5` -> [0, 1, 2, 5]; `none` -> []."""
    out: list[int] = []
    for part in text.split(","):
        a, _, b = part.strip().partition("-")
        if a.isdigit():
            out += range(int(a), int(b) + 1) if b.isdigit() else [int(a)]
    return out


def span(values: list[int]) -> str:
    """[0, 1, 2, 5] in any order, repeats allowed -> `0-2, 5`: the scan's own `ranges`, so the tree writes
    ranks and layers as the overview does."""
    return ranges(sorted(set(values)))


def _expert_rows(par: Parallel) -> dict[str, str]:
    out: dict[str, str] = {}
    for layer, text in par.holders:
        for piece in text.split(" · "):
            if m := _EXPERTS.match(piece.strip()):
                who = numbers(m["who"])
                words = f"rank{'s' if len(who) > 1 else ''} {span(who)}" if who else "no rank"
                for e in numbers(m["which"]):
                    out[f"{layer}.{e}"] = f"expert {e} · {words}"
    return out


def _stage_rows(par: Parallel) -> dict[str, str]:
    stages: dict[str, set[int]] = {}
    ranks: dict[str, set[int]] = {}
    for part, text in par.holders:
        stage = _STAGE.match(part)
        if stage is None:
            continue
        paths: list[str] = []
        who: list[int] = []
        for piece in (p.strip() for p in text.split(" · ")):
            if m := _LAYERS.match(piece):
                paths += [str(i) for i in numbers(m["which"])]
            elif m := _TIED.match(piece):
                paths += [f"tied_modules.{k.strip()}" for k in m["keys"].split(",")]
            elif m := _RANKS.match(piece):
                who = numbers(m["who"])
        for p in paths:
            stages.setdefault(p, set()).add(int(stage["stage"]))
            ranks.setdefault(p, set()).update(who)
    return {
        p: f"stage{'s' if len(s) > 1 else ''} {span(list(s))} · rank{'s' if len(ranks[p]) > 1 else ''} "
        f"{span(list(ranks[p]))}"
        for p, s in stages.items()
    }


def module_holders(par: Parallel | None) -> dict[str, str]:
    """Module path -> who holds it, in words: `expert 3 · ranks 1, 3`, `stage 1 · ranks 2-3`; an MoE layer's
    experts module (AutoEP's fused experts too) -> its whole row."""
    if par is None:
        return {}
    if par.kind == "expert":
        return {**{layer: text for layer, text in par.holders}, **_expert_rows(par)}
    if par.kind == "pipeline":
        return _stage_rows(par)
    return {}
