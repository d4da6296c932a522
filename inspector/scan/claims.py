"""Every file in a tag folder accounted for: each rank file is claimed by exactly one role of the layout.

A layout, once recognised and its run's degrees read, says which files it reads as a table of `Role`s: a
name pattern, the coordinates a name gives (data-parallel rank, stage, expert, ...) and whether a file with
those coordinates belongs to this run. `claim` matches every name of the folder against that table once. A
file of a known DeepSpeed pattern that no role claims (an expert the run never had, a layer file of another
topology, a rank beyond the world size), or a second file for one role, is an error finding naming it and
why, and the layout reads only what was claimed: a stray file can neither pass silently nor stand in for the
real one. Names of no known pattern (notes, configs, `zero_to_fp32.py`) are left alone.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from inspector.scan.locate import (
    EXPERT_RE,
    EXPP_RE,
    LAYER_RE,
    MODEL_RE,
    OPTIM_RE,
    PADDED,
    PLAIN,
    ZERO3_MODEL_RE,
)
from inspector.scan.model import Finding, Severity
from inspector.system.units import plural
from inspector.text import shown

Coords = tuple[int, ...]
Why = Callable[[Coords], "str | None"]

LAYER_FILE_RE = re.compile(rf"^layer_{PADDED}-model_states\.pt$")
LAYER_TP_RE = re.compile(rf"^layer_{PADDED}-model_{PADDED}-model_states\.pt$")
# EXPERT_RE with its MoE layer: pre-0.6 names (`expert_E_mp_rank_MM_…`) match KNOWN only, and are refused
LAYER_EXPERT_RE = re.compile(rf"^(layer_{PLAIN}_)expert_{PLAIN}_mp_rank_{PADDED}_model_states\.pt$")
# Every rank-file pattern DeepSpeed writes into a tag folder: a name of one of these that a layout does not
# claim is a stray checkpoint file, never a harmless side file.
KNOWN: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("optimizer file", OPTIM_RE),
    ("ZeRO-3 model-states file", ZERO3_MODEL_RE),
    ("model-states file", MODEL_RE),
    ("pipeline layer file", LAYER_RE),
    ("expert file", EXPERT_RE),
    ("expert-parallel optimizer file", EXPP_RE),
)
STRAY = "stray-file"  # the finding's code
_SHOWN = 8  # stray files named one by one; the rest counted
_HINT = (
    "Remove the file, or restore the tag folder from one save: files of another run or topology may "
    "hold other values under the same names."
)


def _anything(_: Coords) -> str | None:
    return None


@dataclass(frozen=True)
class Role:
    """One kind of file a layout reads: its names, the coordinates a name gives, and whether a file with
    those coordinates belongs to the run (`why_not` answers None, or the reason it does not)."""

    what: str  # in messages, and the key of `Claims.of`: unique within a table
    pattern: re.Pattern[str]
    coords: Callable[[re.Match[str]], Coords]
    why_not: Why = _anything


@dataclass
class Claims:
    """What a claim pass found: each role's files by coordinates, and a finding for every file none claims."""

    tag_dir: str
    files: dict[str, dict[Coords, str]] = field(default_factory=dict)  # role -> coordinates -> path
    findings: list[Finding] = field(default_factory=list)
    ignored: list[str] = field(default_factory=list)  # names of no known pattern: not checkpoint files

    def of(self, role: Role) -> dict[Coords, str]:
        return self.files.get(role.what, {})

    @property
    def paths(self) -> frozenset[str]:
        """Every claimed file's path: what the layout may read."""
        return frozenset(p for by in self.files.values() for p in by.values())

    def names(self) -> list[str]:
        """The claimed files' names, for a layout that sorts its files itself."""
        return sorted(os.path.basename(p) for p in self.paths)


def claim(tag_dir: str, names: Iterable[str], roles: Sequence[Role], layout: str) -> Claims:
    """Match every name of the tag folder against the layout's roles (the first role whose pattern matches
    decides); `layout` names the layout in the findings ("this pipeline")."""
    out = Claims(tag_dir, {r.what: {} for r in roles})
    stray: list[tuple[str, str]] = []  # (name, why it does not belong)
    twice: list[tuple[str, str]] = []  # (name, the file already claimed for its place)
    for name in sorted(names):
        role, m = next(((r, m) for r in roles if (m := r.pattern.match(name))), (None, None))
        if role is None or m is None:
            kind = next((k for k, p in KNOWN if p.match(name)), None)
            if kind is None:
                out.ignored.append(name)
            else:
                stray.append((name, f"{layout} has no {kind} of this name"))
            continue
        key = role.coords(m)
        why = role.why_not(key)
        held = out.files[role.what].get(key)
        if why is not None:
            stray.append((name, why))
        elif held is not None:
            twice.append((name, f"{role.what}s for one place: {os.path.basename(held)} and {name}"))
        else:
            out.files[role.what][key] = os.path.join(tag_dir, name)
    out.findings = _findings(tag_dir, stray) + _duplicates(tag_dir, twice) + _unread(tag_dir, out.ignored)
    return out


def _unread(tag_dir: str, ignored: list[str]) -> list[Finding]:
    """One note for `.pt` files of no rank-file name (`mp_rank_0_model_states.pt`, `model.pt`): torch files a
    user may expect to be read, left alone. Other side files (`zero_to_fp32.py`, configs) go unmentioned."""
    pts = [n for n in ignored if n.endswith(".pt")]
    if not pts:
        return []
    more = f" and {len(pts) - 3:,} more" if len(pts) > 3 else ""
    return [
        Finding(
            Severity.INFO,
            "not-read",
            f"{plural(len(pts), 'file')} ending in .pt match no DeepSpeed rank-file name and were not read: "
            f"{', '.join(shown(n) for n in pts[:3])}{more}.",
            tag_dir,
            "DeepSpeed names every rank file by a fixed pattern (mp_rank_00_model_states.pt, "
            "zero_pp_rank_0_mp_rank_00_optim_states.pt, ...); a renamed file is not part of the checkpoint.",
        )
    ]


def _duplicates(tag_dir: str, twice: list[tuple[str, str]]) -> list[Finding]:
    """Two files for one place (`bf16_zero_pp_rank_0_…` beside `zero_pp_rank_0_…`): the first by name is the
    one claimed, and the error (which `damaging` counts) stops the rebuild's proofs and convert."""
    return [
        Finding(
            Severity.ERROR,
            "duplicate-rank",
            f"Two {shown(what)}; files from two runs were mixed.",
            os.path.join(tag_dir, name),
            "Keep only the files of one run.",
        )
        for name, what in twice[:_SHOWN]
    ]


def damaging(findings: Iterable[Finding]) -> bool:
    """Whether error findings stop a layout from rebuilding: a stray file is set aside and never read, so the
    rest still rebuilds (convert still refuses it without --force, as any error finding)."""
    return any(f.severity is Severity.ERROR and f.code != STRAY for f in findings)


def _findings(tag_dir: str, stray: list[tuple[str, str]]) -> list[Finding]:
    """An error per stray file (at most `_SHOWN`, then a count): bounded output for a crafted folder."""
    out = [
        Finding(
            Severity.ERROR,
            STRAY,
            f"{shown(name)} does not belong to this checkpoint: {why}. Nothing is taken from it.",
            os.path.join(tag_dir, name),
            _HINT,
        )
        for name, why in stray[:_SHOWN]
    ]
    if len(stray) > _SHOWN:
        out.append(
            Finding(
                Severity.ERROR,
                STRAY,
                f"{len(stray) - _SHOWN:,} more files of known checkpoint patterns do not belong to this "
                "checkpoint. Nothing is taken from them.",
                tag_dir,
                _HINT,
            )
        )
    return out


# -- the roles the DeepSpeed layouts share; a layout's table is a few of these with its run's degrees --------


def below(*axes: tuple[str, int | None]) -> Why:
    """Coordinates each below the run's degree on its axis, e.g. `below(("data-parallel rank", dp))`;
    None: the run records no degree on that axis (the files present bound it)."""

    def why_not(key: Coords) -> str | None:
        for (label, limit), v in zip(axes, key, strict=False):
            if limit is not None and v >= limit:
                return f"its {label} is {v}, but the run has {plural(limit, label)} (0..{limit - 1})"
        return None

    return why_not


def optim_role(dp: int | None, mp: int | None) -> Role:
    """`[bf16_]zero_pp_rank_D_mp_rank_MM_optim_states.pt`: one per (data-parallel rank, model-parallel rank)."""
    axes = (("data-parallel rank", dp), ("model-parallel rank", mp))
    return Role("optimizer file", OPTIM_RE, lambda m: (int(m.group(2)), int(m.group(3))), below(*axes))


def zero3_model_role(dp: int | None, mp: int | None) -> Role:
    """`zero_pp_rank_D_mp_rank_MM_model_states.pt`: ZeRO-3's model states, one per rank."""
    axes = (("data-parallel rank", dp), ("model-parallel rank", mp))
    return Role(
        "ZeRO-3 model-states file", ZERO3_MODEL_RE, lambda m: (int(m.group(1)), int(m.group(2))), below(*axes)
    )


def model_role(mp: int | None) -> Role:
    """`mp_rank_MM_model_states.pt`: one per model-parallel rank (pipeline: per stage and TP rank)."""
    return Role(
        "model-states file", MODEL_RE, lambda m: (int(m.group(1)),), below(("model-parallel rank", mp))
    )


def expert_role(counts: Mapping[int, int] | None, mp: int | None, source: str = "the model states") -> Role:
    """`layer_L_expert_E_mp_rank_MM_model_states.pt`: one per (MoE layer, global expert, model-parallel rank),
    for the layers and expert counts the run records (`counts`: MoE layer -> its experts; None: not recorded,
    as before DeepSpeed saved `num_experts`, so only the model-parallel rank is checked)."""

    def why_not(key: Coords) -> str | None:
        layer, expert, rank = key
        if counts is None:
            pass
        elif layer not in counts:
            have = ", ".join(map(str, sorted(counts))) or "none"
            return f"the run has no MoE layer {layer} (its MoE layers per {source}: {have})"
        elif expert >= counts[layer]:
            return (
                f"MoE layer {layer} has {counts[layer]} experts per {source} (experts 0..{counts[layer] - 1})"
            )
        return below(("model-parallel rank", mp))((rank,))

    def coords(m: re.Match[str]) -> Coords:
        return (int(m.group(2)), int(m.group(3)), int(m.group(4)))

    return Role("expert file", LAYER_EXPERT_RE, coords, why_not)


def expp_role(ep: int | None, mp: int | None) -> Role:
    """`expp_rank_E_mp_rank_MM_optim_states.pt`: ZeRO-off MoE's optimizer, one per expert-parallel rank."""
    axes = (("expert-parallel rank", ep), ("model-parallel rank", mp))
    return Role(
        "expert-parallel optimizer file", EXPP_RE, lambda m: (int(m.group(1)), int(m.group(2))), below(*axes)
    )


def layer_role(tp: int | None, tp_named: bool) -> Role:
    """A pipeline layer file: `layer_XX-model_states.pt`, or `layer_XX-model_TT-model_states.pt` with the
    model axis (TT the tensor-parallel rank). A run writes one of the two namings, never both."""
    if tp_named:
        axes = (("layer", None), ("tensor-parallel rank", tp))
        return Role("layer file", LAYER_TP_RE, lambda m: (int(m.group(1)), int(m.group(2))), below(*axes))
    return Role("layer file", LAYER_FILE_RE, lambda m: (int(m.group(1)),))


def bounded(limit: int | None, present: int) -> int | None:
    """A recorded degree, unless it exceeds the files present (a damaged record, reported elsewhere): then
    no bound, so a damaged model-states file does not also make every rank file look stray."""
    return limit if limit is not None and limit <= present else None
