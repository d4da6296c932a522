"""Named selections: sets of tensors under a name, for an export. Proposed ones come from the layout itself
(a pipeline stage's modules, an expert's, a tensor-parallel split group, frozen vs trainable, the LoRA adapter),
read from the scan's records (`Parallel.placement`, `TensorInfo.stage`, the TP recipe, `Kind`), never guessed
from names; saved ones are the user's (the app's `m`, kept by `convert/selection_store.py`). The app's picker
and `convert --selection NAME` both resolve a name here, so the two faces export the same tensors."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from inspector.errors import InspectorError, InvalidOptionError
from inspector.scan.model import Checkpoint, Kind, Parallel
from inspector.text import quoted

NAME_LIMIT = 40  # cells: the name is shown in the export form's Selection field and the picker


def checked_name(text: str) -> str:
    """A selection's name as typed, or the refusal (empty, too long, a control character)."""
    name = text.strip()
    if not name:
        raise InvalidOptionError(
            "A selection needs a name.", hint="Type a name such as `stage 1` or `expert 3`."
        )
    if len(name) > NAME_LIMIT or not name.isprintable():
        raise InvalidOptionError(
            f"A selection's name is at most {NAME_LIMIT} printable characters.", hint="Type a shorter name."
        )
    return name


@dataclass(frozen=True)
class Selection:
    """One named set of tensors: `proposed` from the layout, else saved by the user; `why` says, in a few
    words, what the layout record behind a proposed one is."""

    name: str
    tensors: frozenset[str]
    proposed: bool
    why: str = ""


def _owners(ckpt: Checkpoint, modules: Mapping[str, set[int]]) -> dict[int, set[str]]:
    """Key -> the tensors that are one of its modules or lie below one (`4.weight` under `4`): each name's
    prefixes looked up once, so the cost is the tensors times their depth, whatever the number of keys."""
    out: dict[int, set[str]] = {}
    for t in ckpt.tensors:
        head = t.name
        while head:
            for key in modules.get(head, ()):
                out.setdefault(key, set()).add(t.name)
            head = head.rpartition(".")[0]
    return out


def _stages(ckpt: Checkpoint, par: Parallel) -> list[Selection]:
    """One per pipeline stage: the layers and tied modules its row of the placement covers (what its
    model-states files hold, buffers included) and every tensor whose master the stage holds."""
    modules: dict[str, set[int]] = {}
    for h in par.placement:
        if h.stage is not None:
            for m in h.stage_modules:
                modules.setdefault(m, set()).add(h.stage)
    held = _owners(ckpt, modules)
    for t in ckpt.tensors:
        if t.stage is not None:
            held.setdefault(t.stage, set()).add(t.name)
    return [Selection(f"stage {s}", frozenset(n), True, "a pipeline stage") for s, n in sorted(held.items())]


def _experts(ckpt: Checkpoint, par: Parallel) -> list[Selection]:
    """One per expert, over every MoE layer (`expert 3`: each layer's expert 3 module), where an expert is a
    module of its own (AutoEP's fused experts share one tensor per weight, so no set of tensors is one
    expert); then every MoE layer's experts module, and all the rest."""
    modules: dict[str, set[int]] = {}
    layers: dict[str, set[int]] = {}
    for h in par.placement:
        if h.module and h.experts:
            layers[h.module] = {0}
        for span in h.experts if h.module else ():
            for e in span.experts:
                modules.setdefault(f"{h.module}.{e}", set()).add(e)
    why = "an expert, every MoE layer"
    out = [Selection(f"expert {e}", frozenset(n), True, why) for e, n in sorted(_owners(ckpt, modules).items())]
    experts = frozenset(_owners(ckpt, layers).get(0, ()))
    if experts:
        out.append(Selection("all experts", experts, True, "every MoE layer's experts"))
        out.append(Selection("no experts", frozenset(t.name for t in ckpt.tensors) - experts, True,
                             "all but the experts"))  # fmt: skip
    return out


def tp_group(ckpt: Checkpoint, name: str) -> str | None:
    """How a tensor-parallel parameter's shards were joined, as a short group name: `split on dim 1`,
    `replicated`, `sub-parameters`, `averaged`; None without a TP record (the scan's recipe, or --tp-split)."""
    recipe = ckpt.parallel.tp_recipe if ckpt.parallel is not None else None
    if recipe is None:
        return None
    how, what = recipe.join_of(name) or ("rule", "")
    if how == "split":
        return f"split on dim {', '.join(map(str, what))}"
    if how != "rule":  # replicated, sub-parameters
        return how
    words = {"replicated": "replicated", "row": "split on dim 1", "vocab": "split on dim 0",
             "2-sub-params": "sub-parameters", "average": "averaged"}  # fmt: skip
    return words.get(str(what), "split on dim 0")  # unlisted: dim 0, as DeepSpeed's converter joins them


def _tp_groups(ckpt: Checkpoint, par: Parallel) -> list[Selection]:
    """Per tensor-parallel split group (the export joins shards; it cannot write one shard's slice)."""
    if par.tp <= 1 or par.tp_recipe is None:
        return []
    groups: dict[str, set[str]] = {}
    for t in ckpt.tensors:
        if t.kind in (Kind.TRAINABLE, Kind.FROZEN):
            group = tp_group(ckpt, t.name)
            if group is not None:
                groups.setdefault(f"TP {group}", set()).add(t.name)
    if len(groups) < 2:
        return []
    why = "TP shards joined alike"
    return [Selection(g, frozenset(n), True, why) for g, n in sorted(groups.items())]


def _kinds(ckpt: Checkpoint) -> list[Selection]:
    """Trainable and frozen parameters, where the checkpoint has both."""
    trainable = frozenset(t.name for t in ckpt.tensors if t.kind is Kind.TRAINABLE)
    frozen = frozenset(t.name for t in ckpt.tensors if t.kind is Kind.FROZEN)
    if not trainable or not frozen:
        return []
    return [
        Selection("trainable", trainable, True, "optimizer-held"),
        Selection("frozen", frozen, True, "not optimizer-held"),
    ]


def _adapter(ckpt: Checkpoint) -> list[Selection]:
    """The LoRA adapter: exactly what PEFT's adapter_model.safetensors would hold (`scan.peft`)."""
    from inspector.scan.peft import detect_adapter

    try:
        adapter = detect_adapter(ckpt)
    except InspectorError:  # an unreadable adapter_config.json: the adapter export says why
        return []
    if adapter is None or not adapter.tensors:
        return []
    return [Selection("LoRA adapter", frozenset(adapter.tensors), True, "what PEFT saves")]


def proposed(ckpt: Checkpoint) -> tuple[Selection, ...]:
    """The selections the layout proposes, in this order: stages, experts, TP groups, kinds, the adapter.
    One whose tensors are every tensor is left out: it is the default."""
    par = ckpt.parallel
    found = [*(_stages(ckpt, par) + _experts(ckpt, par) + _tp_groups(ckpt, par) if par else [])]
    found += _kinds(ckpt) + _adapter(ckpt)
    every = len(ckpt.tensors)
    seen: set[str] = set()
    out = []
    for s in found:
        if 0 < len(s.tensors) < every and s.name not in seen:
            seen.add(s.name)
            out.append(s)
    return tuple(out)


def choices(
    ckpt: Checkpoint, saved: Mapping[str, frozenset[str]], offered: tuple[Selection, ...] | None = None
) -> tuple[Selection, ...]:
    """What a picker lists: the proposed ones, then the user's (narrowed to the tensors this tag has; one
    with none of them left out). A saved name equal to a proposed one replaces it: the user chose it."""
    present = {t.name for t in ckpt.tensors}
    mine = []
    for name, tensors in saved.items():
        kept = frozenset(tensors & present)
        if kept:
            mine.append(Selection(name, kept, False))
    taken = {s.name for s in mine}
    offered = proposed(ckpt) if offered is None else offered
    return tuple(s for s in offered if s.name not in taken) + tuple(mine)


def resolve(name: str, listed: tuple[Selection, ...]) -> Selection:
    """The selection called `name`, or a refusal listing the names there are (escaped)."""
    for s in listed:
        if s.name == name.strip():
            return s
    there = ", ".join(quoted(s.name) for s in listed) or "none"
    raise InvalidOptionError(
        f"No selection named {quoted(name)} for this checkpoint.",
        hint=f"The selections there are: {there}. Save your own in the app with `m`.",
    )
