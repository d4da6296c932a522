"""A plain Hugging Face model folder (safetensors) as TensorInfos: the base a LoRA run was trained on.

Only headers are read. A safetensors tensor is one contiguous run of bytes, so each becomes a TensorInfo with a
single Segment, and the same positioned reads that serve the DeepSpeed files serve it. Never downloads: a
`base_model_name_or_path` that is not a local folder is an error that says so.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any

from inspector.errors import InspectorError
from inspector.format.dtypes import FROM_SAFETENSORS, itemsize
from inspector.scan.model import Kind, Segment, TensorInfo

_MAX_HEADER = 100_000_000


class BaseModelError(InspectorError):
    """The base model a LoRA run needs is missing or unreadable."""

    title = "Base model not usable"


@dataclass(frozen=True)
class BaseModel:
    folder: str
    tensors: tuple[TensorInfo, ...]
    files: tuple[str, ...]


def _header(path: str) -> tuple[dict[str, Any], int, int]:
    """(header, where data starts, file size)."""
    try:
        with open(path, "rb") as fh:
            raw = fh.read(8)
            n = int.from_bytes(raw, "little") if len(raw) == 8 else -1
            if not 0 < n <= _MAX_HEADER:
                raise ValueError("bad header length")
            header = json.loads(fh.read(n))
        size = os.path.getsize(path)
    except (OSError, ValueError) as exc:
        raise BaseModelError(f"{path} is not a readable safetensors file ({exc}).") from None
    if not isinstance(header, dict):
        raise BaseModelError(f"{path} has a malformed safetensors header.")
    return header, 8 + n, size


def read_safetensors(path: str) -> list[TensorInfo]:
    """Every tensor of one safetensors file, each as a single Segment (offsets checked against the size)."""
    header, start, size = _header(path)
    out = []
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        try:
            dtype = FROM_SAFETENSORS[entry["dtype"]]
            shape = tuple(int(d) for d in entry["shape"])
            begin, end = (int(x) for x in entry["data_offsets"])
        except (KeyError, TypeError, ValueError):
            raise BaseModelError(f"{path}: tensor {name!r} has an unsupported or malformed entry.") from None
        numel = 1
        for d in shape:
            numel *= d
        if end - begin != numel * itemsize(dtype) or start + end > size or begin < 0:
            raise BaseModelError(f"{path}: tensor {name!r} lies outside the file or has the wrong size.")
        out.append(TensorInfo(name, shape, dtype, Kind.FROZEN, (Segment(path, start + begin, numel, dtype),)))
    return out


def read_base_model(folder: str) -> BaseModel:
    """All tensors of `model.safetensors` or the shards its index names."""
    index = os.path.join(folder, "model.safetensors.index.json")
    if os.path.isfile(index):
        try:
            with open(index, encoding="utf-8") as fh:
                files = sorted(set(json.load(fh)["weight_map"].values()))
        except (OSError, ValueError, KeyError, AttributeError) as exc:
            raise BaseModelError(f"{index} is not a readable index ({exc}).") from None
    elif os.path.isfile(os.path.join(folder, "model.safetensors")):
        files = ["model.safetensors"]
    else:
        bins = [n for n in os.listdir(folder) if n.endswith(".bin") or n.endswith(".pt")]
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
        if os.path.basename(f) != f:
            raise BaseModelError(f"{index} names {f!r}, which is not a file in {folder}.")
        tensors += read_safetensors(os.path.join(folder, f))
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
            "`huggingface-cli download`).",
        )
    return path
