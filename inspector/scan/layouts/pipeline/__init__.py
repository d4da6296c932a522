"""Pipeline parallel (`deepspeed.pipe.PipelineModule`): layer files, `mp_rank_SS` per stage, tied modules,
ZeRO-0/1, and pipeline x tensor parallel (`layer_XX-model_TT`).

    scanner.py  Pipeline: one tensor-parallel rank's pipeline into a `Checkpoint`
    files.py    the tag folder's files by stage and layer
    names.py    parameter names, shapes and tied modules from the layer files
    zero0.py    ZeRO off in fp16: the stage file's unnamed masters, named by proof
    tensor.py   one pipeline per tensor-parallel rank, joined as tensor-parallel shards
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from dataclasses import replace

from inspector.scan.layouts.base import Found, ScanOptions, TagLayout
from inspector.scan.locate import PADDED
from inspector.scan.model import Checkpoint, Parallel, Segment, TensorInfo
from inspector.scan.universal_needs import UniversalNeeds, zero_off
from inspector.system.units import plural

_MP_RANK = re.compile(rf"mp_rank_{PADDED}_")  # the number as the scan accepted it (locate's one spelling)


def words(par: Parallel) -> str:
    """`pipeline parallel: 2 stages x 2 tensor-parallel shards x 1 data-parallel rank`."""
    tp = f" × {plural(par.tp, 'tensor-parallel shard')}" if par.tp > 1 else ""
    return f"pipeline parallel: {plural(par.pp, 'stage')}{tp} × {plural(par.dp, 'data-parallel rank')}"


def stage_of(t: TensorInfo, tp: int) -> int | None:
    """The stage whose optimizer files hold `t`'s master: DeepSpeed names each stage's files
    `..._mp_rank_MM_...` with MM = stage x tp + tensor-parallel rank (FORMAT.md §3.6), so the segments (the
    bytes actually read) say it. None for a tensor read from a layer file (`layer_NN-model_00`: a buffer or
    frozen parameter) or one whose segments name several stages. A tied weight has one answer, the stage
    whose copy is read, though the placement lists it on every stage that uses it. With ZeRO off in fp32 the
    master is read from its layer file: its moments' segments then say the stage."""
    stages = _stages(t.segments, tp) or _stages([s for _, segs in t.moments for s in segs], tp)
    return stages.pop() if len(stages) == 1 else None


def _stages(segments: Sequence[Segment], tp: int) -> set[int]:
    return {int(m.group(1)) // max(tp, 1) for s in segments if (m := _MP_RANK.search(os.path.basename(s.file)))}


def staged(ckpt: Checkpoint) -> Checkpoint:
    """The checkpoint with its words and each tensor's stage recorded (reports name it: layer numbers alone do
    not tell which stage's files, and so which ranks, to look at), and what a universal checkpoint of it needs."""
    par = ckpt.parallel or Parallel("pipeline")
    tensors = tuple(replace(t, stage=stage_of(t, par.tp)) for t in ckpt.tensors)
    needs = UniversalNeeds(zero_off=zero_off("pipeline"))
    return replace(ckpt, tensors=tensors, parallel=replace(par, words=words(par)), universal=needs)


class Pipeline(TagLayout):
    name = "pipeline"
    recognises = "layer_XX-model_states.pt layer files"

    def claims(self, found: Found) -> bool:
        from inspector.scan.layouts.pipeline.files import is_pipeline

        return is_pipeline(list(found.names))

    def scan(self, found: Found, options: ScanOptions) -> Checkpoint:
        from inspector.scan.layouts.pipeline.tensor import scan_pipeline_tensor

        return staged(scan_pipeline_tensor(found.location, list(found.names), options.tp_split, found.trees))
