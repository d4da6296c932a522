"""Where a tensor lives in a pipeline-parallel layout, for reports that name a tensor: the stage whose
optimizer files hold its fp32 master. DeepSpeed names each stage's files `..._mp_rank_MM_...` with
MM = stage x tp + tensor-parallel rank (FORMAT.md §3.6), so the segments already say it.

This is not `Parallel.placement` read backwards. The placement says which layers and tied modules each stage
holds, so a tied module is on every stage that uses it; this says which file the scan reads one tensor's bytes
from, so a tied weight has one answer (the copy read), and a buffer or frozen parameter read from a layer file
(`layer_NN-model_00`, no stage in its name) has none. Health names that stage so a reader knows which
files to open; the segments are the bytes actually read, so they are the source of truth for it (with ZeRO
off in fp32 the master is read from its layer file: its moments' segments then say the stage)."""

from __future__ import annotations

import os
import re
from collections.abc import Sequence

from inspector.scan.locate import PADDED
from inspector.scan.model import Checkpoint, Segment

_MP_RANK = re.compile(rf"mp_rank_{PADDED}_")  # the number as the scan accepted it (locate's one spelling)


def stage_of(ckpt: Checkpoint, name: str) -> int | None:
    """The pipeline stage holding `name`'s master; None outside a pipeline, for a tensor read from a layer
    file (buffers, frozen parameters) or one whose segments name several stages."""
    p = ckpt.parallel
    if p is None or p.kind != "pipeline":
        return None
    try:
        t = ckpt.tensor(name)
    except KeyError:
        return None
    stages = _stages(t.segments, p.tp)
    if not stages:  # ZeRO off in fp32: the master is the layer file's weight, its moments the stage file's
        stages = _stages([s for _, segs in t.moments for s in segs], p.tp)
    return stages.pop() if len(stages) == 1 else None


def _stages(segments: Sequence[Segment], tp: int) -> set[int]:
    return {
        int(m.group(1)) // max(tp, 1) for s in segments if (m := _MP_RANK.search(os.path.basename(s.file)))
    }


__all__ = ["stage_of"]
