"""Which DCP keys are the model, which the optimizer's moments, and which saver wrote the folder.

The flat keys join a nested state dict's path with dots, and parameter names hold dots too, so a key is split
by its `planner_data` path. The savers' conventions (FORMAT.md's DCP section): `dcp.save({'model': …,
'optim': …})`, Accelerate (`model` in `pytorch_model_fsdp_N/`, `optimizer` in `optimizer_N/`), Lightning
(`model`, `optimizer_0`, …; `meta.pt` beside), torchtitan (model keys at the top level; `optimizer`,
`train_state`, `lr_schedulers`, `dataloader` beside them).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field

from inspector.parse.dcp import DcpMetadata

MOMENTS = ("exp_avg", "exp_avg_sq")
_OPTIM = re.compile(r"optim(?:izer)?(?:_\d+)?\Z")
_TITAN = {"optimizer", "train_state", "lr_schedulers", "dataloader"}


@dataclass
class Roles:
    """The model's keys by parameter name, each parameter's moments and `step` key, and the saver."""

    saver: str
    model: dict[str, str] = field(default_factory=dict)  # fqn -> key
    moments: dict[str, dict[str, str]] = field(default_factory=dict)  # fqn -> {exp_avg: key, ...}
    steps: dict[str, str] = field(default_factory=dict)  # fqn -> its `step` key
    optimizer_keys: int = 0  # keys of the optimizer's state and hyper-parameters


SAVERS = {  # `saver_of`'s answers in words (`Checkpoint.saved_by`: the summary's "Saved by")
    "torch": "PyTorch DCP (torch.distributed.checkpoint)",
    "torchtitan": "PyTorch DCP (torchtitan)",
    "accelerate": "PyTorch DCP (Accelerate FSDP)",
    "lightning": "PyTorch DCP (Lightning FSDP)",
}


def saver_of(folder: str, names: tuple[str, ...], top: set[str]) -> str:
    """The program that wrote the folder, from its name, its side files and its top-level keys."""
    base = os.path.basename(folder.rstrip(os.sep))
    if base.startswith("pytorch_model_fsdp_"):
        return "accelerate"
    if base.endswith(".ckpt") and "meta.pt" in names:
        return "lightning"
    if top & _TITAN or re.fullmatch(r"step-\d+", base):
        return "torchtitan"
    return "torch"


def model_keys(meta: DcpMetadata) -> dict[str, str]:
    """fqn -> key of the model's tensors: under `model` when the saver nested it, else the top-level keys."""
    nested = {k: p for k in meta.tensors if len(p := meta.path_of(k)) > 1 and p[0] == "model"}
    if nested:
        return {".".join(p[1:]): k for k, p in nested.items()}
    return {k: k for k in meta.tensors if len(meta.path_of(k)) == 1}


def optimizer_roles(meta: DcpMetadata, roles: Roles) -> None:
    """Each model parameter's `exp_avg`, `exp_avg_sq` and `step` keys in `meta` (nested `state.<fqn>.<name>`
    or torchtitan's flattened `state.<fqn>.<name>` under one key), added to `roles`."""
    for key in (*meta.tensors, *meta.bytes):
        path = meta.path_of(key)
        if len(path) < 2 or not _OPTIM.match(path[0]):
            continue
        roles.optimizer_keys += 1
        rest = ".".join(path[1:])
        if not rest.startswith("state.") or key not in meta.tensors:
            continue
        fqn, _, name = rest[len("state.") :].rpartition(".")
        if fqn not in roles.model:
            continue
        if name in MOMENTS:
            roles.moments.setdefault(fqn, {})[name] = key
        elif name == "step":
            roles.steps[fqn] = key


def roles_of(meta: DcpMetadata, folder: str, names: tuple[str, ...]) -> Roles:
    top = {meta.path_of(k)[0] for k in (*meta.tensors, *meta.bytes) if len(meta.path_of(k)) > 1}
    roles = Roles(saver_of(folder, names, top), model_keys(meta))
    optimizer_roles(meta, roles)
    return roles
