"""A run's `ds_config` (the DeepSpeed config every model-states and optimizer-states file saves) as one typed
record, parsed once at the input boundary: the keys the scan decides on, each typed and bounded, and the whole
config as bounded JSON data (`raw`: to compare two files' configs, never to branch on). A key of the wrong
type reads as absent, as DeepSpeed's own defaults would have it: the scan then falls back on what the files
themselves show (the optimizer's `zero_stage`, the stored dtypes), never on a guess from the config."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from inspector.parse.tree import Node


@dataclass(frozen=True, slots=True)
class DsConfig:
    """`zero_stage`: `zero_optimization.stage` (0-3), None when absent or not such an int. `fp16`, `bf16`:
    whether `fp16.enabled` / `bf16.enabled` (or its older spelling `bfloat16.enabled`) is `true`.
    `data_before_expert_parallelism`: `use_data_before_expert_parallelism` is `true` (AutoEP's other rank
    grouping)."""

    zero_stage: int | None = None
    fp16: bool = False
    bf16: bool = False
    data_before_expert_parallelism: bool = False
    raw: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))

    @classmethod
    def parse(cls, node: Node) -> DsConfig:
        """The record of a `ds_config` node: a dict, or anything else (absent, None, a crafted object) as empty.
        Its size and depth are bounded by `Node.json`, which refuses a larger one naming the file."""
        data = node.json() if node.is_mapping() else {}
        return cls.of(data if isinstance(data, dict) else {})

    @classmethod
    def of(cls, raw: Mapping[str, Any]) -> DsConfig:
        """The record of plain, already bounded config data (a `Node.json` result, or a test's dict)."""
        zero = raw.get("zero_optimization")
        stage = zero.get("stage") if isinstance(zero, Mapping) else None
        return cls(
            zero_stage=stage if type(stage) is int and 0 <= stage <= 3 else None,
            fp16=_enabled(raw, "fp16"),
            bf16=_enabled(raw, "bf16") or _enabled(raw, "bfloat16"),
            data_before_expert_parallelism=raw.get("use_data_before_expert_parallelism") is True,
            raw=MappingProxyType(dict(raw)),
        )

    @property
    def compute_dtype(self) -> str | None:
        """The 16-bit dtype the config trains in (bf16 first, as DeepSpeed checks it), or None (fp32)."""
        return "bfloat16" if self.bf16 else "float16" if self.fp16 else None


def _enabled(raw: Mapping[str, Any], key: str) -> bool:
    section = raw.get(key)
    return isinstance(section, Mapping) and section.get("enabled") is True


__all__ = ["DsConfig"]
