"""Where a tensor lives in a pipeline-parallel layout, for reports that name a tensor: the stage whose
optimizer files hold its fp32 master. DeepSpeed names each stage's files `..._mp_rank_MM_...` with
MM = stage x tp + tensor-parallel rank (FORMAT.md §3.6), so the segments already say it.

This is not `Parallel.placement` read backwards. The placement says which layers and tied modules each stage
holds, so a tied module is on every stage that uses it; this says which file the scan reads one tensor's bytes
from, so a tied weight has one answer (the copy read), and a buffer or frozen parameter read from a layer file
(`layer_NN-model_00`, no stage in its name) has none. Health names that stage so a reader knows which
files to open; the segments are the bytes actually read, so they are the source of truth for it."""

from __future__ import annotations

import os
import re

from inspector.scan.locate import PADDED
from inspector.scan.model import Checkpoint

_MP_RANK = re.compile(rf"mp_rank_{PADDED}_")  # the number as the scan accepted it (locate's one spelling)


def stage_of(ckpt: Checkpoint, name: str) -> int | None:
    """The pipeline stage holding `name`'s master; None outside a pipeline, for a tensor read from a layer
    file (buffers, frozen parameters) or one whose segments name several stages."""
    p = ckpt.parallel
    if p is None or p.kind != "pipeline":
        return None
    try:
        segments = ckpt.tensor(name).segments
    except KeyError:
        return None
    stages = {
        int(m.group(1)) // max(p.tp, 1) for s in segments if (m := _MP_RANK.search(os.path.basename(s.file)))
    }
    return stages.pop() if len(stages) == 1 else None


__all__ = ["stage_of"]
