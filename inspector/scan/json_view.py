"""`scan --json`: the checkpoint as one object with stable keys and plain types (and the LoRA adapter in it)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from inspector.errors import InspectorError
from inspector.scan.holding import Holding
from inspector.scan.model import Checkpoint, GroupInfo, Kind, RankInfo, TensorInfo
from inspector.scan.peft import detect_adapter
from inspector.scan.summary import read_bytes_by_source


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
        "parallel": _parallel_json(ckpt),
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
        "groups": [_group_json(g) for g in ckpt.groups],
        "ranks": [_rank_json(r) for r in ckpt.ranks],
        "tensors": [_tensor_json(t) for t in ckpt.tensors],
        "findings": [f.as_dict() for f in ckpt.findings],
        "other_runs": list(ckpt.other_runs),
        "adapter": adapter_json(ckpt),
    }


def _parallel_json(ckpt: Checkpoint) -> dict[str, Any] | None:
    """The model-parallel layout: in words as the overview prints it (`words`), its degrees, and which ranks
    hold each part, in words (`holders`, as the overview prints them) and as data (`placement`)."""
    p = ckpt.parallel
    if p is None:
        return None
    return {
        "kind": p.kind,
        "words": p.words,
        "pp": p.pp,
        "ep": p.ep,
        "tp": p.tp,
        "dp": p.dp,
        "holders": [{"part": part, "holders": where} for part, where in p.holders],
        "placement": [_holding_json(h) for h in p.placement],
    }


def _holding_json(h: Holding) -> dict[str, Any]:
    """One `Holding` as data, for scripts that want the ranks without reading `holders`' words: an MoE layer
    (`module`, `experts` spans), a pipeline stage (`stage`, `layers`, `tied`), a tensor-parallel shard
    (`shard`), or a stage's shard; `ranks` are global ranks (an MoE layer's are in its spans)."""
    return {
        "module": h.module or None,
        "experts": [{"experts": list(e.experts), "ranks": list(e.ranks)} for e in h.experts],
        "stage": h.stage,
        "shard": h.shard,
        "layers": list(h.layers),
        "tied": list(h.tied),
        "ranks": list(h.ranks),
    }


def _group_json(g: GroupInfo) -> dict[str, Any]:
    return {
        "index": g.index,
        "params": g.param_count,
        "numel": g.numel,
        "padded_numel": g.padded_numel,
        "partition_numel": g.partition_numel,
        "hyperparams": _plain(g.hyperparams),
    }


def _rank_json(r: RankInfo) -> dict[str, Any]:
    return {
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


def _tensor_json(t: TensorInfo) -> dict[str, Any]:
    return {
        "name": t.name,
        "shape": list(t.shape),
        "dtype": t.dtype,
        "kind": str(t.kind),
        "numel": t.numel,
        "bytes": t.nbytes,
        **({"alias_of": t.alias_of} if t.alias_of else {}),
        **({"group": t.group} if t.group is not None else {}),
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
    """JSON values: any mapping (the parsed files' are read-only `mappingproxy`s) is an object, not its repr."""
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, str | int | float | bool) or value is None:
        return value
    return repr(value)
