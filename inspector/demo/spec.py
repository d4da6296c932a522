"""What a demo checkpoint holds: the spec, a small LLaMA-shaped architecture and its DeepSpeed config.

A model with tied embeddings, a frozen position table, fp32 and int64 buffers, a decay and a no-decay param
group and odd sizes that need padding, sized to a parameter target.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from inspector.format.dtypes import OUTPUT_ALIASES

DS_VERSION = "0.19.8"
HALF = {k: OUTPUT_ALIASES[k] for k in ("bf16", "fp16", "fp32")}  # the demo's --dtype words


@dataclass(frozen=True)
class DemoSpec:
    """What to write. `params` is a target; the real count is within a few percent."""

    stage: int = 2
    world_size: int = 2
    dtype: str = "bf16"
    params: int = 2_000_000
    frozen: bool = True
    tied: bool = True
    bf16_optimizer: bool = False
    sub_group_size: int = 1_000_000_000
    steps: int = 3
    tag: str | None = None
    layers: int | None = None  # decoder layers (None: 2 to 16 by size); many make a rank file of many records


@dataclass(frozen=True)
class Param:
    name: str
    shape: tuple[int, ...]
    kind: str  # "trainable" | "frozen" | "buffer"
    dtype: str = "float32"  # buffers only
    decay: bool = True

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


def architecture(spec: DemoSpec) -> tuple[list[Param], dict[str, str]]:
    """Module-order parameters and buffers, and the tied aliases {alias: owner}."""
    n = spec.params
    layers = spec.layers or (2 if n < 2_000_000 else 4 if n < 100_000_000 else 8 if n < 2_000_000_000 else 16)
    vocab = min(50_257, 1_001 + (n // 20_000) * 2)
    max_pos = 129 if spec.frozen else 0
    # 4h^2 (attention) + 3*h*ffn (mlp, ffn ~ 8h/3) per layer, plus embeddings
    a, b = 12.0 * layers, float(vocab + max_pos)
    hidden = max(8, int((-b + math.sqrt(b * b + 4 * a * n)) / (2 * a)))
    hidden += 1 - hidden % 2  # odd, so flat groups need padding
    ffn = hidden * 8 // 3 + 1
    ps = [Param("model.embed_tokens.weight", (vocab, hidden), "trainable")]
    if spec.frozen:
        ps.append(Param("model.embed_positions.weight", (max_pos, hidden), "frozen"))
    for i in range(layers):
        p = f"model.layers.{i}."
        ps += [Param(p + f"self_attn.{x}_proj.weight", (hidden, hidden), "trainable") for x in "qkvo"]
        ps.append(Param(p + "self_attn.o_proj.bias", (hidden,), "trainable", decay=False))
        ps += [
            Param(p + "mlp.gate_proj.weight", (ffn, hidden), "trainable"),
            Param(p + "mlp.up_proj.weight", (ffn, hidden), "trainable"),
            Param(p + "mlp.down_proj.weight", (hidden, ffn), "trainable"),
            Param(p + "input_layernorm.weight", (hidden,), "trainable", decay=False),
            Param(p + "post_attention_layernorm.weight", (hidden,), "trainable", decay=False),
        ]
    ps += [
        Param("model.norm.weight", (hidden,), "trainable", decay=False),
        Param("model.rotary_emb.inv_freq", (max(1, hidden // 16),), "buffer", "float32"),
        Param("model.tokens_seen", (), "buffer", "int64"),
    ]
    tied: dict[str, str] = {}
    if spec.tied:
        ps.append(Param("lm_head.weight", (vocab, hidden), "trainable"))
        tied["lm_head.weight"] = "model.embed_tokens.weight"
    return ps, tied


def ds_config(spec: DemoSpec) -> dict[str, Any]:
    cfg: dict[str, Any] = {
        "train_micro_batch_size_per_gpu": 4,
        "gradient_accumulation_steps": 1,
        "optimizer": {"type": "Adam", "params": {"lr": 0.0001, "torch_adam": True}},
        "zero_optimization": {"stage": spec.stage},
    }
    if spec.stage == 3 and spec.sub_group_size != 1_000_000_000:
        cfg["zero_optimization"]["sub_group_size"] = spec.sub_group_size
    if spec.dtype == "bf16":
        cfg["bf16"] = {"enabled": True}
    elif spec.dtype == "fp16":
        cfg["fp16"] = {"enabled": True, "initial_scale_power": 8}
    if spec.bf16_optimizer:
        cfg["data_types"] = {"grad_accum_dtype": "fp32"}
    return cfg
