"""Where a PyTorch Distributed Checkpoint is: the folder holding `.metadata` and the `*.distcp` files, reached
from what the user named (the folder itself, Accelerate's `checkpoint-N/` holding `pytorch_model_fsdp_N/`,
torchtitan's `checkpoint/` holding `step-N/`, Lightning's `*.ckpt/` folder with `meta.pt`), and the folders
that look like DCP but are not readable here, refused in words that name them."""

from __future__ import annotations

import os
import re

from inspector.errors import UnsupportedCheckpointError
from inspector.scan.layouts.base import Found
from inspector.system.bytesource import ByteSource
from inspector.text import shown

METADATA = ".metadata"
_DISTCP = re.compile(r"__(\d+)_(\d+)\.distcp\Z")
_RANK_LOCAL = re.compile(r"__\d+\.metadata\Z")
_ACCELERATE = re.compile(r"pytorch_model_fsdp_(\d+)\Z")
_STEP = re.compile(r"(?:step|checkpoint)-(\d+)\Z")


def is_dcp(names: list[str] | tuple[str, ...]) -> bool:
    """A DCP folder by its names: `.metadata` beside `__R_N.distcp` files (or only `.metadata`: refused later
    with what is missing)."""
    return METADATA in names


def rank_of(name: str) -> int | None:
    m = _DISTCP.match(name)
    return int(m.group(1)) if m else None


def locate(path: str, source: ByteSource, tag: str | None = None) -> Found | None:
    """The DCP folder at `path` (or one level below it), or None when `path` is not a DCP checkpoint."""
    path = source.absolute(path)
    if not source.is_dir(path):
        return None
    names = source.listdir(path)
    if is_dcp(names):
        return _found(source, _root_of(path, source), path, names)
    if tag and tag in names and source.is_dir(inner := os.path.join(path, tag)):  # a save the user named
        inner_names = source.listdir(inner)
        return _found(source, path, inner, inner_names) if is_dcp(inner_names) else None
    _refuse_lookalikes(path, names)
    subs = sorted(n for n in names if source.is_dir(os.path.join(path, n)))
    accel = sorted((int(m.group(1)), n) for n in subs if (m := _ACCELERATE.match(n)))
    if accel:
        inner = os.path.join(path, accel[0][1])
        return _found(source, path, inner, source.listdir(inner)) if is_dcp(source.listdir(inner)) else None
    runs = []
    for sub in subs:
        inner = os.path.join(path, sub)
        inner_names = source.listdir(inner)
        if is_dcp(inner_names):
            runs.append((_order(source, inner, sub), sub, inner_names))
        elif any(_ACCELERATE.match(n) for n in inner_names) and _STEP.match(sub):
            runs.append((_order(source, inner, sub), sub, []))  # a Trainer run's checkpoint-N
    if not runs:
        return None
    runs.sort(reverse=True)
    _, latest, inner_names = runs[0]
    inner = os.path.join(path, latest)
    if not inner_names:
        return locate(inner, source)
    return _found(source, path, inner, inner_names, tuple(n for _, n, _ in runs[1:]))


def _order(source: ByteSource, folder: str, name: str) -> tuple[int, int]:
    """Which of several saves is the latest: the step in its name (`step-N`, `checkpoint-N`, Lightning's
    `…step=N…`), else the time it was saved."""
    m = _STEP.match(name) or re.search(r"step=(\d+)", name)
    if m:
        return (1, int(m.group(1)))
    try:
        return (0, source.size_and_mtime(os.path.join(folder, METADATA))[1])
    except OSError:
        return (0, 0)


def _root_of(folder: str, source: ByteSource) -> str:
    """Accelerate's model folder answers for its `checkpoint-N/` (config.json and the optimizer are there)."""
    parent = os.path.dirname(folder.rstrip(os.sep))
    if _ACCELERATE.match(os.path.basename(folder.rstrip(os.sep))) and source.contains(parent):
        return parent
    return folder


def _found(
    source: ByteSource, root: str, folder: str, names: list[str], others: tuple[str, ...] = ()
) -> Found:
    _refuse_lookalikes(folder, names)
    tag = os.path.basename(folder.rstrip(os.sep)) if root != folder else ""
    tags = (tag, *others) if tag else ()  # the saves below one root answer to a tag, as DeepSpeed's tags do
    return Found(source, root, tag, folder, tuple(sorted(names)), how="dcp", tags=tags, other_runs=others)


def _refuse_lookalikes(folder: str, names: list[str]) -> None:
    """DCP folders this tool cannot read, each named: rank-local metadata, or a HuggingFaceStorageWriter's."""
    if METADATA not in names and any(_RANK_LOCAL.match(n) for n in names):
        raise UnsupportedCheckpointError(
            f"{shown(folder)}: a PyTorch Distributed Checkpoint saved with rank-local metadata "
            "(`__<rank>.metadata`, `use_collectives=False`): no global `.metadata` says how the ranks' "
            "chunks join.",
            hint="Load it with torch.distributed.checkpoint on the same world size and save it again with "
            "the default collectives; then scan the new folder.",
            title="Rank-local DCP metadata",
        )


def refuse_hf_writer(folder: str, names: tuple[str, ...], head: bytes) -> None:
    """A `.metadata` that is JSON beside safetensors files: HuggingFaceStorageWriter's folder."""
    if head.lstrip()[:1] == b"{" or any(n.endswith(".safetensors") for n in names):
        raise UnsupportedCheckpointError(
            f"{shown(folder)}: a PyTorch Distributed Checkpoint written by HuggingFaceStorageWriter: its "
            "tensors are already safetensors files (with a JSON `.metadata` index), not `.distcp` items.",
            hint="Use its safetensors files directly (consolidate their shards with torch's "
            "`consolidate_safetensors_files` if they are split by rank).",
            title="DCP folder of safetensors",
        )
