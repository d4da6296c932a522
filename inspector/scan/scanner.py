"""Scan a DeepSpeed ZeRO checkpoint into a `Checkpoint`: metadata only, no tensor data.

This module decides which layout a tag holds (a universal checkpoint, a pipeline, tensor-parallel shards, MoE
with or without ZeRO, or plain data parallel) and hands it to that layout's module; `zero` scans one
data-parallel world: locate (which tag), files (which rank files, loaded), layout (where each parameter's bytes
are), tensors (the tensor list), assemble (the record), with the findings collected.
"""

from __future__ import annotations

from inspector.scan.files import classify
from inspector.scan.layouts.zero.scanner import ZeroScanner
from inspector.scan.locate import locate
from inspector.scan.model import Checkpoint


def scan(path: str, tag: str | None = None, *, tp_split: tuple[tuple[str, str], ...] = ()) -> Checkpoint:
    """Scan `path` (root, tag folder, Trainer run, Lightning .ckpt or universal checkpoint) into a `Checkpoint`.
    `tp_split`: (glob, rule) pairs saying how a tensor-parallel checkpoint that records no split joins its
    shards (rule `0`, `1` or `replicated`); the first glob a parameter name matches applies."""
    from inspector.remote.roots import source_at
    from inspector.scan.layouts.universal.scanner import find_universal, scan_universal

    source = source_at(path, "checkpoint")  # local folder or bucket prefix: decided once, here
    if (uni := find_universal(path, tag, source=source)) is not None:
        return scan_universal(uni, source)
    loc = locate(path, tag, source)
    from inspector.scan.layouts.pipeline.files import is_pipeline
    from inspector.scan.layouts.pipeline.tensor import scan_pipeline_tensor

    names = loc.source.listdir(loc.tag_dir)
    if is_pipeline(names):
        return scan_pipeline_tensor(loc, names, tp_split)
    from inspector.scan.layouts.tensor.scanner import scan_tensor, tp_ranks

    if len(tp_ranks(names)) > 1:
        return scan_tensor(loc, names, tp_split)
    from inspector.scan.layouts.moe.zero0 import is_moe_zero0, scan_moe_zero0

    if is_moe_zero0(names):
        return scan_moe_zero0(loc, names)
    files = classify(loc.tag_dir, loc.source, experts_ok=True)
    from inspector.scan.layouts.autoep.scanner import is_autoep, scan_autoep

    if is_autoep(loc, files):
        return scan_autoep(loc, files)
    if files.experts:
        from inspector.scan.layouts.moe.scanner import scan_moe

        return scan_moe(loc, files)
    return ZeroScanner(loc, files).build()
