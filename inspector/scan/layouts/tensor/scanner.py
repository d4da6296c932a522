"""Tensor-parallel checkpoints (AutoTP training, Megatron-style runs; FORMAT.md §3.6, §4.2).

Each `mp_rank_TT` is its own ZeRO world with its own optimizer files (under ZeRO-3 also one model-states file
per data-parallel rank, `zero_pp_rank_D_mp_rank_TT_…`, whose `param_shapes` are the shard's shapes): the
data-parallel scan rebuilds every tensor-parallel shard as it rebuilds any checkpoint. The shards join by what the checkpoint records in
`universal_checkpoint_info`: replicated parameters are taken once (every other shard's copy compared),
row-parallel ones join on dim 1, vocabulary-parallel ones on dim 0 with the padding rows cut, the rest on dim 0.
What the checkpoint does not record is refused with what is missing, never guessed: no recipe at all, a regex
pattern instead of a name, averaged or AutoTP-unsupported parameters. Fused sub-parameters (`qkv_proj`,
`gate_up_proj`) join each sub-parameter's pieces in turn, by the widths recorded (`join.py`).
"""

from __future__ import annotations

import fnmatch
import os
from collections.abc import Mapping, Sequence
from dataclasses import replace
from functools import partial
from typing import Any

from inspector.errors import InspectorError, NotACheckpointError
from inspector.parse.layers import AFFINE_FORMAT, ParallelDims, TpRecipe
from inspector.parse.states import ModelStates
from inspector.scan.claims import (
    Claims,
    bounded,
    claim,
    damaging,
    expert_role,
    model_role,
    optim_role,
    zero3_model_role,
)
from inspector.scan.files import RankFiles
from inspector.scan.holding import Holding
from inspector.scan.layouts.base import tree_at
from inspector.scan.layouts.tensor.join import Refused, layout_of, records_differ, stored_shape, with_joined
from inspector.scan.locate import MODEL_RE, OPTIM_RE, ZERO3_MODEL_RE, Location
from inspector.scan.model import Checkpoint, Finding, Kind, Parallel, Segment, Severity, TensorInfo
from inspector.scan.parallel_checks import CopyChecks
from inspector.scan.tensor_lay import lay
from inspector.scan.tp_rules import SPLIT_RULES
from inspector.text import shown

Segs = tuple[Segment, ...]


def tp_ranks(names: Sequence[str]) -> set[int]:
    """The model-parallel ranks a tag folder's file names mention."""
    out = set()
    for n in names:
        if m := MODEL_RE.match(n):
            out.add(int(m.group(1)))
        elif m := OPTIM_RE.match(n):
            out.add(int(m.group(3)))
        elif m := ZERO3_MODEL_RE.match(n):
            out.add(int(m.group(2)))
    return out


def scan_tensor(
    loc: Location, names: Sequence[str], tp_split: Sequence[tuple[str, str]] = (), trees: dict[str, Any] | None = None
) -> Checkpoint:
    """Scan every tensor-parallel shard as a data-parallel checkpoint, then join the shards' tensors; `trees`:
    what the claims loaded (`Found.trees`), taken instead of loading a file again."""
    trees = {} if trees is None else trees
    present = len(names)
    shards = _shard_files(loc, names)
    model0 = _model_file(shards[0])
    assert model0 is not None
    tree0 = tree_at(trees, model0, loc.source)
    dims = ParallelDims.parse(tree0, model0)
    recipe = TpRecipe.parse(tree0, model0)
    tp = dims.tp_degree or dims.mp_world_size or len(shards)
    findings: list[Finding] = []
    if tp > present:
        findings.append(
            Finding(
                Severity.ERROR,
                "world-size",
                f"The model states say tp_degree={tp:,}, but the tag folder holds only {present} files.",
                model0,
            )
        )
        tp = len(shards)
    claims = _claims(loc, names, tp, ModelStates.parse(tree0, model0).dp_world_size, dims.num_experts, shards)
    findings += claims.findings
    shards = _shard_files(loc, names, frozenset(claims.names()))
    findings += _missing_shards(shards, tp, loc)
    scanned = {t: _shard(loc, f, trees) for t, f in sorted(shards.items()) if _model_file(f) is not None and t < tp}
    for t, c in scanned.items():
        findings += [f for f in map(partial(_in_shard, t), c.findings) if f not in findings]
    base = scanned[0]
    tensors, used = join_shards(scanned, tp, recipe, tp_split, findings, loc, trees)
    dp = base.world_size
    ranks = [replace(r, rank=r.rank * tp + t) for t, c in sorted(scanned.items()) for r in c.ranks]
    placement = tuple(
        Holding(shard=t, ranks=tuple(d * tp + t for d in range(c.world_size)))
        for t, c in sorted(scanned.items())
    )
    return replace(
        base,
        tensors=tuple(tensors),
        findings=tuple(findings),
        world_size=tp * dp,
        files=tuple(f for c in scanned.values() for f in c.files),
        ranks=tuple(sorted(ranks, key=lambda r: r.rank)),
        module_copy_bytes=sum(c.module_copy_bytes for c in scanned.values()),
        parallel=Parallel("tensor", tp=tp, dp=dp, placement=placement, tp_recipe=used),
    )


def _missing_shards(shards: Mapping[int, RankFiles], tp: int, loc: Location) -> list[Finding]:
    """A finding per tensor-parallel rank that cannot be scanned: all its files gone, or (ZeRO-3) the
    rank-0 model states its scan starts from."""
    out = []
    for t in range(tp):
        files = shards.get(t)
        if files is not None and _model_file(files) is not None:
            continue
        what = f"The files of tensor-parallel rank {t} (mp_rank_{t:02d}_…) are missing."
        if files is not None and files.zero3_model:  # ZeRO-3: other data-parallel ranks' files are here
            first = f"zero_pp_rank_0_mp_rank_{t:02d}_model_states.pt"
            what = f"The model states of tensor-parallel rank {t}, {first}, are missing."
        hint = "Copy the complete checkpoint folder; every tensor-parallel rank writes its own."
        out.append(Finding(Severity.ERROR, "missing-shard", what, loc.tag_dir, hint))
    return out


_PER_SHARD = ("missing-rank", "incomplete")  # findings that are about one shard's data-parallel world


def _in_shard(t: int, f: Finding) -> Finding:
    """A shard's finding about its own data-parallel ranks, saying which shard (DP rank 1 of which?)."""
    if f.code not in _PER_SHARD:
        return f
    return replace(f, message=f"Tensor-parallel shard {t} (mp_rank_{t:02d}): {f.message}")


def join_shards(
    scanned: Mapping[int, Checkpoint],
    tp: int,
    recipe: TpRecipe | None,
    tp_split: Sequence[tuple[str, str]],
    findings: list[Finding],
    loc: Location,
    trees: Mapping[str, Any] | None = None,
) -> tuple[list[TensorInfo], TpRecipe | None]:
    """Every shard's tensors joined into full ones by the recorded split (or the user's `--tp-split` where
    none is recorded, or only as regular expressions), and the split used; nothing while a shard is missing
    or damaged (the findings say why)."""
    complete = len(scanned) == tp and not damaging(findings)
    model0 = next((f.path for f in scanned[0].files if f.role == "model"), loc.tag_dir) if scanned else ""
    if complete and recipe is not None and (other := records_differ(scanned, recipe, loc.source, trees or {})):
        findings.append(
            Finding(
                Severity.ERROR,
                "tp-records-disagree",
                f"{shown(other)} records another universal_checkpoint_info than {shown(model0)}: the shards "
                "would be joined by records that disagree.",
                other,
                "The shards come from different runs or a record was edited; copy the checkpoint again.",
            )
        )
        return [], None
    if (recipe is None or recipe.regex) and tp_split and complete:  # a record we cannot read: the user's split
        recipe = _user_recipe(scanned[0], tp_split, findings, model0)
        complete = recipe is not None
    with CopyChecks(loc.source) as copies:  # replicated tensors compared: each file opened once, not per tensor
        return (_join(scanned, recipe, findings, loc, copies), recipe) if complete else ([], None)


def _model_file(files: RankFiles) -> str | None:
    """A shard's rank-0 model states: `mp_rank_TT_…` (ZeRO-1/2) or `zero_pp_rank_0_mp_rank_TT_…` (ZeRO-3)."""
    return files.model if files.model is not None else files.zero3_model.get(0)


def _claims(
    loc: Location,
    names: Sequence[str],
    tp: int,
    dp: int | None,
    experts: Sequence[int] | None,
    shards: Mapping[int, RankFiles],
) -> Claims:
    """Every file of the folder claimed (scan/claims.py): per tensor-parallel rank its model states (under
    ZeRO-3 one per data-parallel rank) and optimizer files, and with MoE its expert files."""
    dp = bounded(dp, len(names))
    zero3 = any(f.zero3_model for f in shards.values())
    roles = [optim_role(dp, tp), zero3_model_role(dp, tp) if zero3 else model_role(tp)]
    roles += [expert_role(dict(enumerate(experts)), tp)] if experts is not None else []
    return claim(loc.tag_dir, names, roles, "this tensor-parallel checkpoint")


def _shard_files(
    loc: Location, names: Sequence[str], only: frozenset[str] | None = None
) -> dict[int, RankFiles]:
    """Each tensor-parallel rank's model and optimizer files (under ZeRO-3 every data-parallel rank of a shard
    writes its own model states); rank numbers bounded by the files present. `only`: the claimed names."""
    present = len(names)
    shards: dict[int, RankFiles] = {}
    for n in names if only is None else [n for n in names if n in only]:
        path = os.path.join(loc.tag_dir, n)
        if m := MODEL_RE.match(n):
            shards.setdefault(int(m.group(1)), RankFiles(present=present)).model = path
        elif m := OPTIM_RE.match(n):
            shards.setdefault(int(m.group(3)), RankFiles(present=present)).optim[int(m.group(2))] = path
        elif m := ZERO3_MODEL_RE.match(n):
            shards.setdefault(int(m.group(2)), RankFiles(present=present)).zero3_model[int(m.group(1))] = path
    high = [r for t, f in shards.items() for r in (t, *f.optim, *f.zero3_model) if r >= present]
    if high:
        raise NotACheckpointError(
            f"{loc.tag_dir} holds a rank file numbered {max(high):,} but only {present} files in all: a stray or "
            "crafted file, since every rank of a run writes its own file.",
            hint="Remove the stray file (or restore the missing rank files) and try again.",
            title="Impossible rank number",
        )
    if 0 not in shards or _model_file(shards[0]) is None:
        zero3 = any(f.zero3_model for f in shards.values())
        first = "zero_pp_rank_0_mp_rank_00_model_states.pt" if zero3 else "mp_rank_00_model_states.pt"
        raise NotACheckpointError(
            f"{loc.tag_dir}: no {first}.",
            hint="Copy the complete checkpoint folder; each tensor-parallel rank writes one.",
        )
    return shards


def _user_recipe(
    shard0: Checkpoint, tp_split: Sequence[tuple[str, str]], findings: list[Finding], model_file: str
) -> TpRecipe | None:
    """The split the user stated (`--tp-split GLOB=0|1|replicated`, first match wins) for a checkpoint that
    records none. Every parameter must be matched: one left out is named, never given a default."""
    rules: dict[str, str] = {}
    unmatched = []
    for t in shard0.tensors:
        rule = next((SPLIT_RULES[r] for glob, r in tp_split if fnmatch.fnmatchcase(t.name, glob)), None)
        if rule is not None:
            rules[t.name] = rule
        elif t.kind is not Kind.TIED:
            unmatched.append(t.name)
    if unmatched:
        findings.append(
            Finding(
                Severity.ERROR,
                "tp-unrecorded",
                f"{len(unmatched)} parameter(s) match no --tp-split pattern (e.g. "
                f"{unmatched[0]}); the checkpoint does not record how they were split.",
                model_file,
                "Add a --tp-split PATTERN=0|1|replicated that covers them (PATTERN is a glob on parameter names).",
            )
        )
        return None
    return TpRecipe(model_file, rules, frozenset(), None, ())


def _shard(loc: Location, files: RankFiles, trees: dict[str, Any]) -> Checkpoint:
    from inspector.scan.layouts.zero.scanner import ZeroScanner
    from inspector.scan.layouts.zero.zero0 import is_zero0, scan_zero0

    if is_zero0(files) and (ckpt := scan_zero0(loc, files, shard=True, trees=trees)) is not None:
        return ckpt  # AutoTP with ZeRO off: each rank's masters in its own model states

    scanner = ZeroScanner(loc, files, trees)  # rank 0's model states: the tree read for the recipe
    scanner.shard = True
    return scanner.build()


def _join(
    shards: Mapping[int, Checkpoint], recipe: TpRecipe | None, findings: list[Finding], loc: Location, copies: CopyChecks
) -> list[TensorInfo]:
    """One tensor per name from every shard's piece, by the recorded rule; what is not recorded: a finding."""
    model0 = shards[0].files[-1].path if shards[0].files else loc.tag_dir
    problem = _recipe_problem(recipe, model0)
    if problem is not None or recipe is None:
        findings += [problem] if problem else []
        return []
    out = []
    parts = [shards[t] for t in sorted(shards)]
    held = [{t.name for t in c.tensors} for c in parts]
    for t0 in parts[0].tensors:
        if any(t0.name not in names for names in held):
            findings.append(
                Finding(
                    Severity.ERROR,
                    "tp-mismatch",
                    f"{t0.name} is missing from some tensor-parallel shards.",
                    loc.tag_dir,
                    "The shards come from different runs.",
                )
            )
            continue
        rule = "alias" if t0.kind is Kind.TIED else recipe.rules.get(t0.name, "dim0")
        if t0.name in recipe.unsupported or rule == "average":
            why = (
                "AutoTP marked it unconvertible"
                if t0.name in recipe.unsupported
                else f"its shards are {rule}"
            )
            message = f"{t0.name}: {why}; joining such shards is not supported yet."
            findings.append(Finding(Severity.ERROR, "tp-unsupported", message, model0))
            continue
        try:
            out.append(_joined(t0, [c.tensor(t0.name) for c in parts], rule, recipe, copies))
        except InspectorError as exc:
            code = exc.code if isinstance(exc, Refused) else "tp-mismatch"
            findings.append(Finding(Severity.ERROR, code, exc.message, model0, exc.hint))
    return _resolve_aliases(out)


def _recipe_problem(recipe: TpRecipe | None, model0: str) -> Finding | None:
    """Why the recorded split cannot be used at all (none recorded, or recorded as regexes), if it cannot."""
    if recipe is None:
        return Finding(
            Severity.ERROR,
            "tp-unrecorded",
            "This tensor-parallel checkpoint does not record how its parameters were split (no "
            "universal_checkpoint_info in the model states), so the shards cannot be joined without guessing.",
            model0,
            "Say it: --tp-split PATTERN=0|1|replicated for every parameter (PATTERN a glob on parameter names; "
            "0: shards stacked on dim 0, 1: side by side on dim 1, replicated: one copy).",
        )
    if recipe.regex:
        return Finding(
            Severity.ERROR,
            "tp-unrecorded",
            f"{len(recipe.regex)} split rule(s) in universal_checkpoint_info are regular expressions (e.g. "
            f"{recipe.regex[0][:60]!a}), not parameter names; they are not evaluated.",
            model0,
            "Only anchored parameter names (as AutoTP writes them) are read; Megatron-DeepSpeed's patterns are "
            "regular expressions. State the split: --tp-split PATTERN=0|1|replicated for every parameter.",
        )
    if recipe.affine_version > AFFINE_FORMAT or recipe.affine_regex:
        why = (
            f"is of format version {recipe.affine_version}; DeepSpeed 0.19.8 reads up to {AFFINE_FORMAT} and "
            "refuses it"
            if recipe.affine_version > AFFINE_FORMAT
            else f"names parameters by {len(recipe.affine_regex)} regular expression(s) (e.g. "
            f"{recipe.affine_regex[0][:60]!a}), which are not evaluated"
        )
        return Finding(
            Severity.ERROR,
            "tp-unreadable",
            f"universal_checkpoint_info's affine map {why}. DeepSpeed joins the parameters it covers by it, "
            "ahead of the category lists, so which parameters it covers and how cannot be known.",
            model0,
            "Re-save the checkpoint with this DeepSpeed version, or remove the affine map if the category lists "
            "describe every parameter.",
        )
    return None


def _resolve_aliases(out: list[TensorInfo]) -> list[TensorInfo]:
    """A tied alias points at its owner's joined bytes (its shards' pieces were each shard's owner)."""
    joined = {t.name: t for t in out}
    return [
        replace(
            t,
            shape=joined[t.alias_of].shape,
            segments=joined[t.alias_of].segments,
            moments=joined[t.alias_of].moments,
            module_copy=joined[t.alias_of].module_copy,
        )
        if t.kind is Kind.TIED and t.alias_of in joined
        else t
        for t in out
    ]


def _joined(
    t0: TensorInfo, pieces: list[TensorInfo], rule: str, recipe: TpRecipe, copies: CopyChecks
) -> TensorInfo:
    if rule == "alias" or t0.kind is Kind.BUFFER:
        return t0
    shapes = [p.shape for p in pieces]
    layout = layout_of(t0.name, rule, recipe, shapes)
    if layout.scaled:
        raise Refused(
            "tp-scaled",
            f"{t0.name}: the affine map records pieces held at scale {', '.join(map(str, layout.scaled))} "
            "(shard = full x scale). DeepSpeed's converter divides the weights by it and refuses to carry "
            "the optimizer moments; this tool does not rescale, so it refuses rather than write the stored "
            "values as the weights.",
            "DeepSpeed's ds_to_universal refuses it too (the moments cannot pass a scaled piece); nothing is converted.",
        )
    if len({(b.start, b.shape) for b in layout.blocks}) == 1 and len(pieces) > 1:  # whole on every shard
        for i, p in enumerate(pieces[1:], 1):
            if copies.differ(t0, p):
                raise InspectorError(
                    f"{t0.name} is recorded as replicated, but tensor-parallel shard {i}'s copy "
                    "differs from shard 0's.",
                    hint="The shards come from different saves.",
                )
        return t0
    shape = stored_shape(layout.logical, shapes)  # a joined 3-D view folded back to the shards' rank
    return with_joined(t0, pieces, lambda segs: lay(layout, segs, t0.name), shape)


__all__ = ["join_shards", "scan_tensor", "tp_ranks"]
