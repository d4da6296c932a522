"""Find a PEFT LoRA adapter in a scanned checkpoint: its layers, its config, and PEFT's own key names.

A model wrapped by `peft.get_peft_model` names its tensors `base_model.model.<module>.lora_A.<adapter>.weight`,
`…<module>.base_layer.weight` (the wrapped layer) and `…<module>.modules_to_save.<adapter>.weight`. Trainer saves
`adapter_config.json` beside the DeepSpeed files. From names and config alone (nothing is read here) this says
which tensors form the adapter, what PEFT would call them in `adapter_model.safetensors` (the adapter name
removed), what the plain model would call the base weights, and each layer's scale: alpha/r, or alpha/sqrt(r)
with rsLoRA, honouring `rank_pattern` / `alpha_pattern` as PEFT does.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from inspector.errors import InspectorError, UnsupportedCheckpointError
from inspector.parse.config import adapter_config
from inspector.parse.pattern import PatternError, PatternSet
from inspector.scan.model import Checkpoint, Kind, TensorInfo

ADAPTER_CONFIG = "adapter_config.json"
PEFT_PREFIX = "base_model.model."
_LORA_RE = re.compile(
    r"^(?P<module>.+)\.(?P<part>lora_A|lora_B|lora_embedding_A|lora_embedding_B|lora_magnitude_vector)"
    r"\.(?P<adapter>[^.]+)(?:\.(?P<suffix>weight|bias))?$"
)
_SAVE_RE = re.compile(r"^(?P<module>.+)\.modules_to_save\.(?P<adapter>[^.]+)\.(?P<rest>.+)$")


class AdapterError(InspectorError):
    """An adapter that cannot be exported or merged as asked."""

    title = "Adapter problem"


@dataclass(frozen=True)
class LoraLayer:
    """One adapted layer: its A and B tensors, where its base weight lives, and its scale."""

    module: str  # name in the checkpoint, e.g. base_model.model.model.layers.0.self_attn.q_proj
    a: str
    b: str
    r: int
    scale: float
    embedding: bool  # lora_embedding_A/B: delta = (B @ A)^T
    fan_in_fan_out: bool
    lora_bias: str | None = None  # lora_B.<adapter>.bias (merge refuses it)

    @property
    def base_weight(self) -> str:
        """The plain model's name for the weight this layer adapts (`model.layers.0.self_attn.q_proj.weight`)."""
        return plain_name(self.module + ".weight")

    @property
    def transposed(self) -> bool:
        """Whether the delta is (B @ A)^T: embeddings (always, in PEFT) and fan_in_fan_out (Conv1D) layers."""
        return self.embedding or self.fan_in_fan_out


@dataclass(frozen=True)
class Adapter:
    """A LoRA adapter found in a checkpoint (config from adapter_config.json when Trainer left one)."""

    name: str  # the adapter name inside tensor names ("default")
    layers: tuple[LoraLayer, ...]
    tensors: tuple[str, ...]  # every checkpoint tensor that PEFT's adapter_model.safetensors holds
    config: Mapping[str, Any] = field(default_factory=dict)
    config_path: str | None = None
    problems: tuple[str, ...] = ()  # reasons a merge is refused (DoRA, lora_bias, ...)

    @property
    def r(self) -> int | None:
        return self.config.get("r") if self.config else (self.layers[0].r if self.layers else None)

    @property
    def alpha(self) -> float | None:
        return self.config.get("lora_alpha") if self.config else None

    @property
    def rslora(self) -> bool:
        return bool(self.config.get("use_rslora", False))

    @property
    def target_modules(self) -> list[str]:
        seen: dict[str, None] = {}
        for layer in self.layers:
            seen[layer.module.rpartition(".")[2]] = None
        return list(seen)

    @property
    def base_model(self) -> str | None:
        """`base_model_name_or_path` from adapter_config.json (a local folder or a Hub id)."""
        value = self.config.get("base_model_name_or_path")
        return value if isinstance(value, str) and value else None

    def numel(self, ckpt: Checkpoint) -> int:
        return sum(ckpt.tensor(n).numel for n in self.tensors)


def is_lora(name: str) -> bool:
    """A LoRA parameter (lora_A/B, lora_embedding_A/B, DoRA magnitude) of any adapter."""
    return _LORA_RE.match(name) is not None


def plain_name(name: str) -> str:
    """A PEFT-wrapped name as the unwrapped model has it: prefix, `base_layer.` and modules_to_save removed."""
    name = name.removeprefix(PEFT_PREFIX)
    name = name.replace(".base_layer.", ".")
    m = _SAVE_RE.match(name)
    if m:
        name = f"{m.group('module')}.{m.group('rest')}"
    return name.replace(".original_module.", ".")


def peft_key(name: str, adapter: str) -> str:
    """PEFT's key in adapter_model.safetensors (`_remove_adapter_name_from_state_dict_key`, modules_to_save)."""
    m = _SAVE_RE.match(name)
    if m and m.group("adapter") == adapter:
        return f"{m.group('module')}.{m.group('rest')}"
    if name.endswith(f".{adapter}"):
        return name.removesuffix(f".{adapter}")
    head, _, suffix = name.rpartition(".")
    head = re.sub(re.escape(f".{adapter}") + r"$", "", head)
    key = f"{head}.{suffix}"
    if key.endswith("lora_magnitude_vector.weight"):  # PEFT keeps DoRA's old key (no .weight)
        key = key.removesuffix(".weight")
    return key


def read_adapter_config(folder: str) -> tuple[dict[str, Any], str] | None:
    """adapter_config.json beside the checkpoint, read through its Source and typed (the fields we use)."""
    from inspector.remote.roots import source_at  # lazily: a local scan loads no store code

    source = source_at(folder, "checkpoint")
    path = os.path.join(source.root, ADAPTER_CONFIG)
    kind = source.kind(path)
    if kind == "missing":
        return None
    try:
        data = source.read_json(path, 4 << 20, "adapter config")
    except InspectorError as exc:
        raise AdapterError(exc.message, hint="Fix or remove the file.") from None
    return adapter_config(data, path), path


class _Scales:
    """Each layer's rank and scale from the config, as PEFT's get_pattern_key picks a `rank_pattern` /
    `alpha_pattern` value: the first key matching the end of the module key (`re.match(rf"(.*\\.)?({key})$",
    key)` there; the same answer in linear time here, all keys in one run per name: `parse.pattern`)."""

    def __init__(self, config: Mapping[str, Any], modules: list[str]) -> None:
        self.config = config
        self.tables = []
        for field_ in ("rank_pattern", "alpha_pattern"):
            patterns = config.get(field_) or {}
            table = PatternSet(patterns)
            try:  # the work in proportion to the config and the names, refused past the budget
                table.check_steps(sum(len(m) for m in modules))
            except PatternError as exc:
                raise AdapterError(
                    f"{ADAPTER_CONFIG}'s {field_}: {exc}.", hint="Name the modules literally instead."
                ) from None
            self.tables.append((table, list(patterns.values())))

    def _value(self, which: int, key: str, default: Any) -> Any:
        table, values = self.tables[which]
        i = table.first(key)
        return default if i is None else values[i]

    def of(self, module: str, r_shape: int) -> tuple[int, float]:
        key = module.removeprefix(PEFT_PREFIX)
        if not self.config:
            return r_shape, math.nan
        r = int(self._value(0, key, self.config.get("r", r_shape)))
        alpha = float(self._value(1, key, self.config.get("lora_alpha", r)))
        return r, alpha / math.sqrt(r) if self.config.get("use_rslora") else alpha / r


def detect_adapter(ckpt: Checkpoint) -> Adapter | None:
    """The LoRA adapter in `ckpt`, or None. Looks at tensor names and adapter_config.json beside the tag."""
    parts: dict[tuple[str, str], dict[str, TensorInfo]] = {}
    for t in ckpt.tensors:
        m = _LORA_RE.match(t.name)
        if m:
            parts.setdefault((m.group("module"), m.group("adapter")), {})[
                m.group("part") + ("." + m.group("suffix") if m.group("suffix") else "")
            ] = t
    if not parts:
        return None
    found = read_adapter_config(ckpt.root)
    names = sorted({a for _, a in parts})
    name = "default" if "default" in names else names[0]
    config, config_path = found if found else ({}, None)
    problems: list[str] = []
    if len(names) > 1:
        problems.append(f"several adapters ({', '.join(names)}); only {name!r} is used")
    if config and config.get("peft_type", "LORA") != "LORA":
        problems.append(f"PEFT type {config.get('peft_type')} is not LoRA")
    if config.get("use_dora") or any(
        k[1] == name and "lora_magnitude_vector.weight" in v for k, v in parts.items()
    ):
        problems.append(
            "DoRA (use_dora) rescales each column by a learned magnitude; merging it is not supported"
        )
    if not config:
        problems.append(f"no {ADAPTER_CONFIG} beside the checkpoint, so lora_alpha is unknown")
    fan = bool(config.get("fan_in_fan_out", False))
    layers = []
    scales = _Scales(config, [m.removeprefix(PEFT_PREFIX) for m, a in parts if a == name])
    for (module, adapter), p in parts.items():
        if adapter != name:
            continue
        emb = "lora_embedding_A" in p
        a = p.get("lora_embedding_A" if emb else "lora_A.weight")
        b = p.get("lora_embedding_B" if emb else "lora_B.weight")
        if a is None or b is None:
            problems.append(f"{module} has only one of lora_A / lora_B")
            continue
        r, scale = scales.of(module, a.shape[0])
        bias = p.get("lora_B.bias")
        if bias is not None:
            problems.append("lora_bias (a bias on lora_B) is not supported when merging")
        layers.append(LoraLayer(module, a.name, b.name, r, scale, emb, fan, bias.name if bias else None))
    saved = [t.name for t in ckpt.tensors if _in_adapter(t, name, config.get("bias", "none"))]
    return Adapter(name, tuple(layers), tuple(saved), config, config_path, tuple(dict.fromkeys(problems)))


def _in_adapter(t: TensorInfo, adapter: str, bias: str) -> bool:
    """Whether PEFT's adapter_model.safetensors holds this tensor: LoRA weights, modules_to_save copies, and
    trained biases when `bias` is "all" / "lora_only"."""
    m = _LORA_RE.match(t.name) or _SAVE_RE.match(t.name)
    if m:
        return m.group("adapter") == adapter
    return bias != "none" and t.name.endswith(".bias") and t.kind is Kind.TRAINABLE


def require_mergeable(adapter: Adapter) -> None:
    """Refuse, clearly, what merging does not support."""
    if adapter.problems:
        raise UnsupportedCheckpointError(
            "Cannot merge this adapter: " + "; ".join(adapter.problems) + ".",
            hint="Export it with --format adapter instead and merge with PEFT, or convert the whole checkpoint.",
        )
