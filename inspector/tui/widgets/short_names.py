"""Tensor names fitted to a narrow column: leading module names shrink first, numbers and the end stay, and
names that would read the same keep the parts that tell them apart (the Health table's name column, its chart's heading)."""

from __future__ import annotations

from collections.abc import Sequence

from inspector.tui.fmt import elide_middle


def elide(name: str, width: int, keep: frozenset[int] = frozenset()) -> str:
    """Fit `name` in `width` cells keeping what tells rows apart: leading module names shrink to their first
    letter (`m.l.12.self_attn.q_proj.weight`) before anything else, numbers and the last two parts stay; only
    then is the front cut. `keep` (parts counted from the end, -1 the last) are the parts that tell this name
    from others that would shrink alike (`lora_A`/`lora_B`): they stay whole, the last two may shrink instead."""
    if len(name) <= width:
        return name
    parts = name.split(".")
    kept = {len(parts) + k for k in keep}
    order = [*range(len(parts) - 2), *(range(len(parts) - 2, len(parts)) if keep else ())]
    for i in order:
        if i not in kept and not parts[i].isdigit() and len(parts[i]) > 1:
            parts[i] = parts[i][0]
            short = ".".join(parts)
            if len(short) <= width:
                return short
    short = ".".join(parts)
    return short if len(short) <= width else "…" + short[len(short) - width + 1 :]


def differing(names: set[str]) -> frozenset[int]:
    """The parts, counted from the end, in which names that shrink alike differ."""
    split = [n.split(".") for n in names]
    depth = min(len(p) for p in split)
    return frozenset(-k for k in range(1, depth + 1) if len({p[-k] for p in split}) > 1)


def elide_all(names: Sequence[str], width: int) -> dict[str, str]:
    """Each name as `_elide` fits it, and where two names would read the same, both with the parts that
    differ kept whole (at 80 columns a LoRA layer's lora_A and lora_B rows once looked identical)."""
    groups: dict[str, set[str]] = {}
    for n in names:
        groups.setdefault(elide(n, width), set()).add(n)
    out: dict[str, str] = {}
    for short_name, same in groups.items():
        keep = differing(same) if len(same) > 1 else frozenset()
        out.update({n: elide(n, width, keep) if keep else short_name for n in same})
    return out


def since_heading(tag: str, room: int) -> str:
    """The change column's heading in `room` cells: the tag's middle is elided, never its end (`global_st…`
    hid which step it was: `global_step120` and `global_step1200` read the same)."""
    for words in ("change since ", "Δ since "):
        if len(words) + len(tag) <= room:
            return words + tag
    return "Δ since " + elide_middle(tag, max(room - 8, 1))
