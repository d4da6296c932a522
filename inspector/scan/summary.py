"""Plain-data views of a Checkpoint for JSON output and for any front end (CLI, TUI)."""

from __future__ import annotations

import re
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from inspector.errors import InspectorError
from inspector.scan.model import Checkpoint, Kind, TensorInfo
from inspector.scan.peft import detect_adapter

_INDEX = re.compile(r"\.\d+(?=\.|$)")


def module_key(name: str) -> str:
    """`model.layers.12.mlp.up_proj.weight` -> `model.layers.*.mlp` (repeated blocks collapse)."""
    return _INDEX.sub(".*", name.rpartition(".")[0]) or "(root)"


def read_bytes_by_source(ckpt: Checkpoint) -> dict[str, int]:
    """Bytes a full conversion to the compute dtype reads from the checkpoint: from the fp32 masters, or with
    `--source module` (the 16-bit module copy of stage-1/2 trainable params, where there is one)."""
    masters = sum(seg.nbytes for t in ckpt.tensors for seg in t.segments)
    module = sum(
        sum(seg.nbytes for seg in (t.module_copy if t.module_copy else t.segments)) for t in ckpt.tensors
    )
    return {"masters": masters, "module": module}


@dataclass
class ModuleRow:
    module: str
    tensors: int = 0
    numel: int = 0
    nbytes: int = 0
    kinds: dict[str, int] = field(default_factory=dict)
    dtypes: set[str] = field(default_factory=set)


def module_rows(tensors: tuple[TensorInfo, ...]) -> list[ModuleRow]:
    rows: OrderedDict[str, ModuleRow] = OrderedDict()
    for t in tensors:
        row = rows.setdefault(module_key(t.name), ModuleRow(module_key(t.name)))
        row.tensors += 1
        row.numel += t.numel
        row.nbytes += t.nbytes
        row.kinds[str(t.kind)] = row.kinds.get(str(t.kind), 0) + 1
        row.dtypes.add(t.dtype)
    return list(rows.values())


def checkpoint_json(ckpt: Checkpoint) -> dict[str, Any]:
    """The `scan --json` object: stable keys, plain types."""
    kinds = {}
    for kind in Kind:
        n, numel = ckpt.count(kind)
        kinds[str(kind)] = {
            "tensors": n,
            "numel": numel,
            "bytes": sum(t.nbytes for t in ckpt.tensors if t.kind is kind),
        }
    return {
        "root": ckpt.root,
        "tag": ckpt.tag,
        "tags": list(ckpt.tags),
        "layout": ckpt.layout,
        "stage": ckpt.stage,
        "world_size": ckpt.world_size,
        "optimizer": ckpt.optimizer,
        "compute_dtype": ckpt.compute_dtype,
        "master_dtype": ckpt.master_dtype,
        "deepspeed_version": ckpt.deepspeed_version,
        "global_steps": ckpt.global_steps,
        "global_samples": ckpt.global_samples,
        "optimizer_step": ckpt.optimizer_step,
        "loss_scale": ckpt.loss_scale,
        "dynamic_loss_scale": ckpt.dynamic_loss_scale,
        "total_file_bytes": ckpt.total_bytes,
        "module_copy_bytes": ckpt.module_copy_bytes,
        "read_bytes_by_source": read_bytes_by_source(ckpt),
        "kinds": kinds,
        "groups": [
            {
                "index": g.index,
                "params": g.param_count,
                "numel": g.numel,
                "padded_numel": g.padded_numel,
                "partition_numel": g.partition_numel,
                "hyperparams": _plain(g.hyperparams),
            }
            for g in ckpt.groups
        ],
        "ranks": [
            {
                "rank": r.rank,
                "optim_file": r.optim_file,
                "model_file": r.model_file,
                "bytes": r.optim_bytes + r.model_bytes,
                "groups": [
                    {
                        "group": g.group,
                        "partition_numel": g.partition_numel,
                        "stored_numel": g.stored_numel,
                        "padding": g.padding,
                    }
                    for g in r.groups
                ],
            }
            for r in ckpt.ranks
        ],
        "tensors": [
            {
                "name": t.name,
                "shape": list(t.shape),
                "dtype": t.dtype,
                "kind": str(t.kind),
                "numel": t.numel,
                "bytes": t.nbytes,
                **({"alias_of": t.alias_of} if t.alias_of else {}),
                **({"group": t.group} if t.group is not None else {}),
            }
            for t in ckpt.tensors
        ],
        "findings": [f.as_dict() for f in ckpt.findings],
        "other_runs": list(ckpt.other_runs),
        "adapter": adapter_json(ckpt),
    }


def adapter_json(ckpt: Checkpoint) -> dict[str, Any] | None:
    """The LoRA adapter in the checkpoint (PEFT), or None; a broken adapter_config.json is reported, not raised."""
    try:
        a = detect_adapter(ckpt)
    except InspectorError as exc:
        return {"error": exc.message}
    if a is None:
        return None
    return {
        "name": a.name,
        "layers": len(a.layers),
        "tensors": len(a.tensors),
        "numel": a.numel(ckpt),
        "r": a.r,
        "lora_alpha": a.alpha,
        "use_rslora": a.rslora,
        "target_modules": a.target_modules,
        "base_model_name_or_path": a.base_model,
        "config": a.config_path,
        "merge_problems": list(a.problems),
    }


def _plain(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, str | int | float | bool) or value is None:
        return value
    return repr(value)
