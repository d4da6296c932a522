"""What a universal checkpoint of a scanned checkpoint needs from its layout (FORMAT.md §4), as one record the
layout fills at scan: how its experts are written, and why DeepSpeed could not resume one where it cannot. The
universal kind decides on this record and on `Parallel.tp_recipe`, never on a layout's name."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


class ExpertFiles(str, Enum):
    """How the universal kind writes a layout's expert weights (`convert/kinds/universal/layouts.py`)."""

    NONE = "none"  # no experts of their own: one file per parameter (tensor-parallel keys from `tp_recipe`)
    # native MoE: one stacked file per MoE layer and local expert slot, cut on dim 0 by expert-parallel rank
    LOCAL_SLOTS = "local-slots"
    # AutoEP: each fused expert weight one `[num_experts, ...]` file, its optimizer group named `ep_size_E`
    FUSED = "fused"


# seen with a bf16 pipeline (tests/interop/test_universal_layouts_interop.py)
ZERO_OFF_WORDS = (
    "ZeRO off (stage 0): DeepSpeed 0.19.8 never reads a universal checkpoint's zero/ folder at stage 0 (tried "
    "with a bf16 pipeline: engine.load_checkpoint hands the model-states file's optimizer entry to "
    "BF16_Optimizer's legacy loader, which fails with KeyError: 0), so it cannot resume one"
)


def zero_off(parallel: str, words: str = ZERO_OFF_WORDS) -> str:
    """Why DeepSpeed cannot resume a universal checkpoint of a `parallel` (`pipeline`, `expert`...) run saved
    with ZeRO off: `a pipeline-parallel checkpoint with ZeRO off (stage 0): ...`."""
    return f"{'an' if parallel[:1] in tuple('aeiou') else 'a'} {parallel}-parallel checkpoint with {words}"


@dataclass(frozen=True, slots=True)
class UniversalNeeds:
    """Filled by the layout that scanned the checkpoint. `experts`: how its experts are written. `zero_off`:
    why DeepSpeed cannot resume a universal checkpoint of this layout when it was saved with ZeRO off (the
    kind refuses with it at stage 0). `not_offered`: why no universal checkpoint is made from it at all (a
    PyTorch DCP folder, which DeepSpeed did not write; a layout whose universal output nothing has shown to
    resume); empty where one is offered."""

    experts: ExpertFiles = ExpertFiles.NONE
    zero_off: str = zero_off("data")
    not_offered: str = ""


__all__ = ["ZERO_OFF_WORDS", "ExpertFiles", "UniversalNeeds", "zero_off"]
