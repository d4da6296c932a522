"""The JSON configs we read beside a checkpoint, typed: `adapter_config.json` (PEFT LoRA). Only the fields
the tool computes with are checked strictly; the rest is kept as plain JSON-safe data for display. The file
itself is copied byte for byte into an adapter export, never re-serialised from this.
"""

from __future__ import annotations

import re
from typing import Any

from inspector.parse.pattern import PatternError, PatternSet
from inspector.parse.tree import Node

_QUANTIFIED_GROUP = re.compile(r"\)[*+?{]")  # nested repetition: the shape of catastrophic backtracking
_BIAS = ("none", "all", "lora_only")


def _patterns(node: Node) -> list[tuple[str, Node]]:
    """`rank_pattern` / `alpha_pattern`: regexes PEFT matches against module names. Each key bounded and
    without quantified groups, all of them compiled together for the linear matcher (`PatternSet`: one
    budget of states for every key, so a crafted config cannot stall the scan or fill memory), and each one
    a regex PEFT's own engine compiles."""
    entries = node.entries("pattern", names=False)
    for key, _ in entries:
        if len(key) > 512 or _QUANTIFIED_GROUP.search(key):
            raise node.fail(f"has a pattern {key[:40]!r}… that is too long or repeats a group")
    try:  # matched in linear time (parse.pattern), never by the backtracking engine
        PatternSet(key for key, _ in entries)
    except PatternError as exc:
        if exc.key is None:
            raise node.fail(f"has patterns that {exc}: name the modules literally instead") from None
        raise node.fail(
            f"has a pattern {exc.key[:40]!r} with {exc} (PEFT's patterns are module-name suffixes)"
        ) from None
    for key, _ in entries:
        try:
            re.compile(key)
        except (re.error, RecursionError):
            raise node.fail(f"has a pattern {key[:40]!r} that is not a valid regex") from None
    return entries


def adapter_config(data: Any, file: str) -> dict[str, Any]:
    """adapter_config.json as the dict `scan.peft` reads, every value it uses of the right type and range."""
    node = Node(data, file)
    if not node.is_mapping():
        raise node.fail("is not a JSON object")
    out: dict[str, Any] = node.json()
    if node.has("r"):
        out["r"] = node.at("r").integer(1, 1 << 20)
    if node.has("lora_alpha"):
        out["lora_alpha"] = node.at("lora_alpha").number()
    for key in ("use_rslora", "use_dora", "fan_in_fan_out"):
        if node.has(key) and not node.at(key).is_none():
            out[key] = node.at(key).flag()
    if node.has("bias") and not node.at("bias").is_none():
        bias = node.at("bias").text(32)
        if bias not in _BIAS:
            raise node.at("bias").fail(f"is {bias!r}, not one of {', '.join(_BIAS)}")
        out["bias"] = bias
    for key in ("peft_type", "base_model_name_or_path"):
        if node.has(key) and not node.at(key).is_none():
            out[key] = node.at(key).text(4096)
    patterns = (("rank_pattern", lambda n: n.integer(1, 1 << 20)), ("alpha_pattern", lambda n: n.number()))
    for key, value in patterns:
        sub = node.at(key) if node.has(key) else None
        if sub is not None and not sub.is_none():
            out[key] = {k: value(v) for k, v in _patterns(sub)}
    return out
