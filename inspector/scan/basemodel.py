"""A plain Hugging Face model folder (safetensors) as TensorInfos: the base a LoRA run was trained on.

Only headers are read. A safetensors tensor is one contiguous run of bytes, so each becomes a TensorInfo with a
single Segment, and the same positioned reads that serve the DeepSpeed files serve it. Never downloads: a
`base_model_name_or_path` that is not a local folder is an error that says so.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from inspector.errors import InspectorError
from inspector.parse.safetensors import read_header, read_index
from inspector.scan.model import Kind, Segment, TensorInfo
from inspector.system.source import Source


class BaseModelError(InspectorError):
    """The base model a LoRA run needs is missing or unreadable."""

    title = "Base model not usable"


@dataclass(frozen=True)
class BaseModel:
    folder: str
    tensors: tuple[TensorInfo, ...]
    files: tuple[str, ...]


def base_source(folder: str) -> Source:
    """The folder a base model is read through. In the Hugging Face hub cache a snapshot's files are links
    into the repository's `blobs/` (`models--org--name/snapshots/<rev>/x -> ../../blobs/<sha>`): there the
    repository folder is the root, so those links stay inside it and any other link out is still refused."""
    real = os.path.realpath(folder)
    snapshots = os.path.dirname(real)
    repo = os.path.dirname(snapshots)
    if os.path.basename(snapshots) == "snapshots" and os.path.basename(repo).startswith("models--"):
        return Source.at(repo, "base model")
    return Source.at(real, "base model")


def read_safetensors(path: str, source: Source | None = None) -> list[TensorInfo]:
    """Every tensor of one safetensors file, each as a single Segment (header checked, offsets in bounds)."""
    src = source or Source.at(os.path.dirname(os.path.abspath(path)), "base model")
    try:
        header = read_header(src, path)
    except InspectorError as exc:
        raise BaseModelError(exc.message, hint=exc.hint or "Use a complete copy of the base model.") from None
    return [
        TensorInfo(e.name, e.shape, e.dtype, Kind.FROZEN, (Segment(path, header.data_start + e.begin, e.numel, e.dtype),))
        for e in header.entries
    ]


def read_base_model(folder: str) -> BaseModel:
    """All tensors of `model.safetensors` or the shards its index names, read through the base's Source."""
    src = base_source(folder)
    index = os.path.join(folder, "model.safetensors.index.json")
    if src.is_file(index):
        try:
            files = read_index(src, index).files
        except InspectorError as exc:
            raise BaseModelError(exc.message, hint="Use a complete copy of the base model.") from None
    elif src.is_file(os.path.join(folder, "model.safetensors")):
        files = ["model.safetensors"]
    else:
        names = src.listdir(folder) if src.is_dir(folder) else []
        bins = [n for n in names if n.endswith(".bin") or n.endswith(".pt")]
        raise BaseModelError(
            f"{folder} holds no model.safetensors (or index).",
            hint=(
                f"It has {', '.join(bins[:3])}: re-save the base with save_pretrained(safe_serialization=True)."
                if bins
                else "Pass the folder of the base model with --base."
            ),
        )
    tensors: list[TensorInfo] = []
    for f in files:
        tensors += read_safetensors(os.path.join(folder, f), src)
    return BaseModel(folder, tuple(tensors), tuple(files))


def resolve_base(base: str | None, from_config: str | None, config_path: str | None) -> str:
    """The base model folder: `--base` first, else adapter_config's name as a local folder (relative to the
    current directory, as PEFT resolves it). Never a download."""
    if base:
        path = os.path.abspath(os.path.expanduser(base))
        if not os.path.isdir(path):
            raise BaseModelError(
                f"--base {base}: {path} is not a folder.", hint="Pass the base model's folder."
            )
        return path
    if not from_config:
        raise BaseModelError(
            "The checkpoint holds only the adapter (Trainer saves LoRA runs without the frozen base weights) "
            f"and {config_path or 'adapter_config.json'} names no base model.",
            hint="Pass the base model's folder with --base DIR.",
        )
    path = os.path.abspath(os.path.expanduser(from_config))
    if not os.path.isdir(path):
        raise BaseModelError(
            f"The checkpoint holds only the adapter; its base, {from_config!r} (base_model_name_or_path in "
            f"{config_path}), is not a local folder from {os.getcwd()}.",
            hint="zero-inspector never downloads. Pass a local copy with --base DIR (e.g. from "
            "`hf download`).",
        )
    return path
