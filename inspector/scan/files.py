"""The rank files of a tag folder: sorted by role and rank, checked to stay inside the checkpoint, loaded.

A file that cannot be read becomes an error finding naming it; only the rank-0 model states are essential.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from inspector.errors import CorruptFileError, InspectorError, UnsupportedCheckpointError
from inspector.format.torchzip import load_tree
from inspector.format.zipreader import os_error
from inspector.scan.locate import EXPERT_RE, EXPP_RE, LAYER_RE, MODEL_RE, OPTIM_RE, ZERO3_MODEL_RE, inside
from inspector.scan.model import Finding, Severity


@dataclass
class RankFiles:
    """A tag folder's rank files by role and DP rank (model-parallel rank 0 only)."""

    optim: dict[int, str] = field(default_factory=dict)
    zero3_model: dict[int, str] = field(default_factory=dict)
    model: str | None = None
    findings: list[Finding] = field(default_factory=list)


def classify(tag_dir: str) -> RankFiles:
    """Sort a tag folder's files by role and DP rank; reject layouts we do not read yet."""
    try:
        names = sorted(os.listdir(tag_dir))
    except OSError as exc:
        raise os_error(tag_dir, exc) from None
    files = RankFiles()
    mp_ranks: set[int] = set()
    layers = [n for n in names if LAYER_RE.match(n)]
    experts = [n for n in names if EXPERT_RE.match(n) or EXPP_RE.match(n)]
    if layers:
        raise UnsupportedCheckpointError(
            f"{tag_dir} is a pipeline-parallel checkpoint ({len(layers)} layer_*-model_states.pt files).",
            hint="Pipeline-parallel (PipelineModule) checkpoints are not supported yet.",
        )
    if experts:
        raise UnsupportedCheckpointError(
            f"{tag_dir} is a native MoE checkpoint ({len(experts)} expert files such as {experts[0]}).",
            hint="Mixture-of-experts checkpoints are not supported yet.",
        )
    for n in names:
        path = os.path.join(tag_dir, n)
        if m := OPTIM_RE.match(n):
            dp, mp = int(m.group(2)), int(m.group(3))
            mp_ranks.add(mp)
            if mp == 0:
                if dp in files.optim:
                    files.findings.append(
                        Finding(
                            Severity.ERROR,
                            "duplicate-rank",
                            f"Two optimizer files for DP rank {dp}: {os.path.basename(files.optim[dp])} and {n}.",
                            path,
                            "Files from two runs were mixed; keep only the files of one run.",
                        )
                    )
                files.optim[dp] = path
        elif m := ZERO3_MODEL_RE.match(n):
            mp_ranks.add(int(m.group(2)))
            if int(m.group(2)) == 0:
                files.zero3_model[int(m.group(1))] = path
        elif m := MODEL_RE.match(n):
            mp_ranks.add(int(m.group(1)))
            if int(m.group(1)) == 0:
                files.model = path
    if len(mp_ranks) > 1:
        raise UnsupportedCheckpointError(
            f"{tag_dir} has {len(mp_ranks)} model-parallel ranks (mp_rank_00..{max(mp_ranks):02d}).",
            hint="Tensor/model-parallel checkpoints hold shards that need model-specific merge rules; "
            "not supported yet.",
        )
    return files


def missing_ranks(found: dict[int, str], expected: int, what: str, tag_dir: str) -> list[Finding]:
    out = []
    for r in range(expected):
        if r not in found:
            out.append(
                Finding(
                    Severity.ERROR,
                    "missing-rank",
                    f"The {what} file for DP rank {r} is missing.",
                    tag_dir,
                    "Copy the complete checkpoint folder; every rank writes its own file.",
                )
            )
    return out


def load_checked(path: str, root: str) -> Any:
    """Unpickle a rank file that lies inside the checkpoint (a link out of it is never followed)."""
    if not inside(path, root):
        raise CorruptFileError(
            f"{path} is a link to a file outside the checkpoint; it was not read.",
            hint="Copy the real file into the tag folder.",
            title="Unsafe link",
        )
    return load_tree(path)


def load_or_finding(path: str, root: str, findings: list[Finding]) -> Any:
    try:
        return load_checked(path, root)
    except InspectorError as exc:
        findings.append(Finding(Severity.ERROR, "unreadable", exc.message, path, exc.hint))
        return None
