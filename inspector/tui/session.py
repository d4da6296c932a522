"""What the user is looking at and has chosen, as plain data: the module tree, the selection, export settings.

No widgets here, so the selection rules (which are convert's include/exclude) are tested without a screen.
"""

from __future__ import annotations

import fnmatch
import re
from dataclasses import dataclass, replace

# the module tree and the selection's include/exclude live in the core (convert/cover), shared with the CLI
from inspector.convert.cover import ModuleNode as ModuleNode
from inspector.convert.cover import build_tree as build_tree
from inspector.convert.cover import selection_options
from inspector.convert.options import ConvertOptions, select
from inspector.scan.model import Checkpoint

_REGEX_ONLY = "^$+()|\\{}"  # syntax a glob never has: `^model\.layers\.[13]` is a regex despite its [ ]


def filter_kind(pattern: str) -> str:
    """How the `/` filter reads `pattern`: "regex" when it has regex-only syntax (anchors, escapes, groups),
    else "glob" when it has * ? [, else "text" (a substring). The screen says which, with the match count."""
    pattern = pattern.strip()
    if any(c in pattern for c in _REGEX_ONLY):
        return "regex"
    return "glob" if any(c in pattern for c in "*?[") else "text"


def name_filter(pattern: str) -> re.Pattern[str] | None:
    """`/` filter, read as `filter_kind` says. Raises re.error for a bad regex (the screen shows it)."""
    pattern = pattern.strip()
    if not pattern:
        return None
    kind = filter_kind(pattern)
    if kind == "regex":
        return re.compile(pattern)
    if kind == "glob":
        glob = pattern if pattern.startswith("*") else f"*{pattern}"
        glob = glob if glob.endswith("*") else f"{glob}*"
        return re.compile(fnmatch.translate(glob))
    return re.compile(re.escape(pattern))


def exported(selected: set[str], shown_only: frozenset[str] | None) -> set[str]:
    """What `e` and `c` export: the selection, narrowed to what the `/` filter shows while one is on (k9s,
    lazygit: act on what you see)."""
    return set(selected) if shown_only is None else set(selected) & shown_only


def export_options(
    ckpt: Checkpoint, selected: set[str], shown_only: frozenset[str] | None, base: ConvertOptions
) -> ConvertOptions:
    """The options `e` and `c` export with: what the filter shows of the selection, as include/exclude."""
    return selection_options(ckpt, exported(selected, shown_only), base)


def preset_selection(ckpt: Checkpoint, opts: ConvertOptions) -> set[str]:
    """The tensors `--include/--exclude` select (frozen/buffer switches stay export options)."""
    return {t.name for t in select(ckpt, replace(opts, exclude_frozen=False, exclude_buffers=False))}


@dataclass(frozen=True)
class ExportSettings:
    """The export form's values as typed (validated on the screen, turned into ConvertOptions by it)."""

    out_dir: str = ""
    format: str = ""  # an OutputKind value ("weights", "model", "adapter", "merged"); "" = the default
    overwrite: bool = False
    executor: str = ""  # "" this machine; "ray": the parts as tasks on a Ray cluster
    ray_address: str = ""  # "" = RAY_ADDRESS, else a local Ray started for the run
    base: str = ""  # the base model folder a merge reads (--base); "" = adapter_config's, as the CLI reads it

    @staticmethod
    def default_out(root: str, tag: str) -> str:
        """The CLI's proposal (`preflight` without OUT): beside the checkpoint, else in the user's home."""
        from inspector.system.disk import proposed_out

        return proposed_out(root, tag)


def carried_selection(names: set[str], carried: tuple[frozenset[str], bool] | None) -> set[str]:
    """Another tag of the same root: the previous selection (names, was it everything) where its names exist
    in this tag; everything when there is none to carry, it was everything, or none of it is here."""
    if carried is None or carried[1]:
        return names
    kept = set(carried[0]) & names
    return kept or names


def rank_of_file(ckpt: Checkpoint) -> dict[str, str]:
    """File path -> a short owner label ("rank 3", "model states") for the detail panel and the tree. The rank
    is the global one the scan's rank table gives: a pipeline stage's or a tensor-parallel shard's optimizer
    file carries only its data-parallel rank in its name (stage 1's `pp_rank_0` file is rank 2's)."""
    out: dict[str, str] = {}
    for f in ckpt.files:
        out[f.path] = f"rank {f.dp_rank}" if f.dp_rank is not None else "model states"
    for r in ckpt.ranks:
        if r.optim_file is not None:
            out[r.optim_file] = f"rank {r.rank}"
        elif r.model_file is not None:  # ZeRO off: each rank's model-states file holds its masters
            out[r.model_file] = f"rank {r.rank}"
    return out
