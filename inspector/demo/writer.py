"""Write a realistic DeepSpeed ZeRO checkpoint in the exact on-disk layout, at any size, in flat memory.

The model and config (spec.py) are laid out as DeepSpeed 0.19.8 would save them after a few steps: model
states, per-rank optimizer files with fp32 masters and Adam moments, 16-bit module copies. Values come
from values.py, any slice on demand; storages are streamed by format/ptwriter, so a 1B-parameter demo needs
no more RAM than a 1M one. Neither torch nor deepspeed is needed.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Callable

from inspector.convert.root import OutputRoot, missing_dirs, remove_empty_dirs
from inspector.demo.ranks import Saver, Stage3Writer, Stage12Writer
from inspector.demo.spec import DS_VERSION, DemoSpec, Param, architecture, ds_config
from inspector.demo.values import buffer_values, expected, master_values, state_values

__all__ = [
    "DemoSpec",
    "Param",
    "architecture",
    "buffer_values",
    "ds_config",
    "expected",
    "master_values",
    "state_values",
    "write_demo",
]


def fresh_names(out_dir: str, spec: DemoSpec) -> list[str]:
    """The names a demo writes into `out_dir` that are not there yet (what a failed run must take back)."""
    tag = spec.tag or f"global_step{spec.steps}"
    return [n for n in (tag, "latest", "demo_spec.json") if not os.path.lexists(os.path.join(out_dir, n))]


def discard_demo(out_dir: str, fresh: list[str], created: list[str]) -> None:
    """Take back what an interrupted demo wrote: its fresh names (a folder with everything in it), then the
    folders it created, if nothing else is in them."""
    if os.path.isdir(out_dir):
        root = OutputRoot(out_dir, lock=False)
        try:
            for name in fresh:
                with contextlib.suppress(OSError):
                    root.remove_tree(name)
        finally:
            root.release(ok=True)
    remove_empty_dirs(created)


def write_demo(out_dir: str, spec: DemoSpec, progress: Callable[[str], None] | None = None) -> str:
    """Write the checkpoint under `out_dir` (root with `latest`); returns the tag folder."""
    if spec.stage not in (1, 2, 3):
        raise ValueError("stage must be 1, 2 or 3")
    if spec.bf16_optimizer and (spec.stage != 1 or spec.dtype != "bf16"):
        raise ValueError("BF16_Optimizer exists only for stage 1 with bf16")
    tag = spec.tag or f"global_step{spec.steps}"
    created = missing_dirs(os.path.abspath(out_dir))
    fresh = fresh_names(out_dir, spec)
    root = OutputRoot(out_dir, lock=False)  # written like every output: nothing below out_dir is followed
    tag_dir = os.path.join(root.path, tag)
    params, tied = architecture(spec)
    groups = [
        [p for p in params if p.kind == "trainable" and p.name not in tied and p.decay],
        [p for p in params if p.kind == "trainable" and p.name not in tied and not p.decay],
    ]
    common = {"ds_config": ds_config(spec), "ds_version": DS_VERSION}
    writer = (
        Stage3Writer(spec, params, tied, groups)
        if spec.stage == 3
        else Stage12Writer(spec, params, tied, groups)
    )
    ok = False
    try:
        root.mkdirs(tag)
        writer.write(Saver(root, tag), common, progress or (lambda _m: None))
        root.write_atomic("latest", tag.encode())
        root.write_atomic("demo_spec.json", json.dumps(spec.__dict__, indent=1).encode())
        ok = True
    finally:
        root.release(ok=True)
        if not ok:
            discard_demo(out_dir, fresh, created)
    return tag_dir
