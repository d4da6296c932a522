"""Checkpoint layouts, one package each, behind `LAYOUTS` in detection order (the protocol: `base.py`).

    base.py      Layout (name, recognises, locate, claims, scan), Found, ScanOptions, TagLayout
    dcp/         PyTorch Distributed Checkpoints (found by their own `.metadata` folder, before the tag walk)
    universal/   a universal checkpoint as input (found by its own folder, before the tag walk)
    pipeline/    PipelineModule: layer files, stages, tied modules, pipeline x tensor parallel
    pipemoe/     pipeline + native MoE: mp_rank_SS stages with their own expert files (before tensor/)
    tensor/      tensor parallel: `mp_rank_TT` shards joined by the recorded recipe
    autoep/      AutoEP's fused experts (ZeRO-3, ZeRO-1/2)
    moe/         native MoE (ZeRO-1/2 and ZeRO off)
    zero/        data-parallel ZeRO, the base the others extend: asked last

A new layout is one package here and one line in `LAYOUTS`, placed before any layout that would also claim
its folders. Nothing outside this folder imports one layout's module (tests/test_boundaries.py): the scanner
asks the registry, and everything after the scan reads the `Checkpoint`'s records.
"""

from __future__ import annotations

from inspector.scan.layouts.autoep import AutoEP
from inspector.scan.layouts.base import Found, Layout, ScanOptions
from inspector.scan.layouts.dcp import LAYOUT as DCP
from inspector.scan.layouts.moe import MoE
from inspector.scan.layouts.pipeline import Pipeline
from inspector.scan.layouts.pipemoe import PipelineMoE
from inspector.scan.layouts.tensor import Tensor
from inspector.scan.layouts.universal import Universal
from inspector.scan.layouts.zero import Zero

LAYOUTS: tuple[Layout, ...] = (DCP, Universal(), Pipeline(), PipelineMoE(), Tensor(), AutoEP(), MoE(), Zero())

__all__ = ["LAYOUTS", "Found", "Layout", "ScanOptions", "names", "universal_folder"]


def names() -> tuple[str, ...]:
    return tuple(layout.name for layout in LAYOUTS)


def universal_folder(path: str, prefer: bool = False) -> str | None:
    """The universal checkpoint folder `path` means, or None; `prefer`: its `latest_universal` even beside
    `latest` (verify's OUT, where it was written)."""
    from inspector.remote.roots import source_at
    from inspector.scan.layouts.universal.scanner import find_universal

    return find_universal(path, None, prefer, source_at(path, "checkpoint"))
