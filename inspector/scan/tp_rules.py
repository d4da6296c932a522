"""`--tp-split PATTERN=0|1|replicated`: how a tensor-parallel checkpoint that does not record its split joins
its shards, as a person writes it. One parser and one writer, so the CLI's flag, `open --tp-split` and the
app's export form accept exactly the same rules and show them the same way."""

from __future__ import annotations

from collections.abc import Iterable

# a rule as the user writes it -> the join the tensor-parallel layout applies
SPLIT_RULES = {"0": "dim0", "1": "row", "replicated": "replicated"}
Rules = tuple[tuple[str, str], ...]  # (glob on parameter names, "0" | "1" | "replicated"); first match wins


def parse_rule(text: str) -> tuple[str, str]:
    """`GLOB=RULE` -> (GLOB, RULE); the glob may itself hold `=` (the rule is what follows the last one)."""
    glob, sep, rule = text.rpartition("=")
    if not sep or not glob or rule not in SPLIT_RULES:
        raise ValueError(f"expected PATTERN=0, PATTERN=1 or PATTERN=replicated, got {text!a}")
    return glob, rule


def parse_rules(text: str) -> Rules:
    """`a=0; b=replicated` (the app's one-line form) -> the rules in order; blank parts are skipped."""
    return tuple(parse_rule(part.strip()) for part in text.split(";") if part.strip())


def rules_text(rules: Iterable[tuple[str, str]]) -> str:
    """The rules in the one-line form `parse_rules` reads back."""
    return "; ".join(f"{glob}={rule}" for glob, rule in rules)
