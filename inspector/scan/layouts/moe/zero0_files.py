"""Which files a ZeRO-off native-MoE tag folder holds (FORMAT.md §3.7): the model states, one
`expp_rank_E_mp_rank_00_optim_states.pt` per expert-parallel rank and the `layer_L_expert_E` files; found by
name here, before any is read, so the claim pass and the scan (`zero0.py`) start from the same list."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass

from inspector.errors import NotACheckpointError
from inspector.scan.locate import EXPERT_RE, EXPP_RE, MODEL_RE, Location


def is_moe_zero0(names: Sequence[str]) -> bool:
    return any(EXPP_RE.match(n) for n in names)


@dataclass
class Zero0Files:
    model: str
    expp: dict[int, str]
    experts: dict[tuple[int, int], str]
    present: int
    names: tuple[str, ...] = ()  # every name in the tag folder, for the claim pass (scan/claims.py)


def zero0_files(loc: Location, names: Sequence[str]) -> Zero0Files:
    """The model states, each expert-parallel rank's optimizer file and the expert files (ranks bounded); any
    other rank file (a second model-parallel rank, an expert file without its MoE layer, as DeepSpeed before
    0.6 wrote it) is left to the claim pass, which reports it."""
    model, expp, experts = None, {}, {}
    for n in names:
        path = os.path.join(loc.tag_dir, n)
        if (m := EXPP_RE.match(n)) and int(m.group(2)) == 0 and int(m.group(1)) < len(names):
            expp[int(m.group(1))] = path
        elif (m := EXPERT_RE.match(n)) and m.group(2) is not None and int(m.group(4)) == 0:
            experts[(int(m.group(2)), int(m.group(3)))] = path
        elif (m := MODEL_RE.match(n)) and int(m.group(1)) == 0:
            model = path
    if model is None:
        raise NotACheckpointError(
            f"{loc.tag_dir}: no mp_rank_00_model_states.pt.", hint="Copy the complete checkpoint folder."
        )
    return Zero0Files(model, expp, experts, len(names), tuple(names))


__all__ = ["Zero0Files", "is_moe_zero0", "zero0_files"]
