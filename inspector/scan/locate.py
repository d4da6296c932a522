"""Find the checkpoint a user means: a root with `latest`, a tag folder, an HF Trainer run, a Lightning .ckpt.

Pure path logic and file classification; nothing is unpickled here.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field

from inspector.errors import NotACheckpointError, UnsupportedCheckpointError
from inspector.scan.model import Finding, Severity

OPTIM_RE = re.compile(r"^(bf16_|fp16_)?zero_pp_rank_(\d+)_mp_rank_(\d+)_?optim_states\.pt$")
ZERO3_MODEL_RE = re.compile(r"^zero_pp_rank_(\d+)_mp_rank_(\d+)_model_states\.pt$")
MODEL_RE = re.compile(r"^mp_rank_(\d+)_model_states\.pt$")
LAYER_RE = re.compile(r"^layer_(\d+)-model_.*\.pt$")
EXPERT_RE = re.compile(r"^(layer_(\d+)_)?expert_(\d+)_mp_rank_(\d+)_model_states\.pt$")
EXPP_RE = re.compile(r"^expp_rank_(\d+)_mp_rank_(\d+)_optim_states\.pt$")
HF_CHECKPOINT_RE = re.compile(r"^checkpoint-(\d+)$")


def _step_key(name: str) -> tuple[int, str]:
    m = re.search(r"(\d+)$", name)
    return (int(m.group(1)) if m else -1, name)


def is_tag_dir(path: str) -> bool:
    """A folder holding DeepSpeed rank files."""
    try:
        names = os.listdir(path)
    except OSError:
        return False
    return any(OPTIM_RE.match(n) or MODEL_RE.match(n) or ZERO3_MODEL_RE.match(n) for n in names)


def list_tags(root: str) -> list[str]:
    """Tag folders under a root, oldest first (numeric order of the trailing step)."""
    try:
        subdirs = [e.name for e in os.scandir(root) if e.is_dir()]
    except OSError:
        return []
    return sorted((d for d in subdirs if is_tag_dir(os.path.join(root, d))), key=_step_key)


@dataclass(frozen=True)
class Location:
    """Where the chosen tag lives and how we got there."""

    root: str
    tag: str
    tags: tuple[str, ...]
    layout: str
    findings: tuple[Finding, ...] = ()
    other_runs: tuple[str, ...] = field(default=())

    @property
    def tag_dir(self) -> str:
        return os.path.join(self.root, self.tag)


def _read_latest(root: str) -> str | None:
    path = os.path.join(root, "latest")
    if not os.path.isfile(path):
        return None
    with open(path, "rb") as fh:
        raw = fh.read(4096)
    return raw.decode("utf-8", "replace").strip()


def _check_tag_name(root: str, tag: str, source: str) -> None:
    bad = not tag or "/" in tag or "\\" in tag or tag in (".", "..") or "\x00" in tag
    if not bad:
        real_root = os.path.realpath(root)
        real_tag = os.path.realpath(os.path.join(root, tag))
        bad = os.path.dirname(real_tag) != real_root
    if bad:
        raise NotACheckpointError(
            f"{source} names the tag {tag!r}, which is not a folder directly inside {root}.",
            hint="A tag must be a plain folder name such as global_step100. Refusing to follow paths out of "
            "the checkpoint; fix the file or pass --tag.",
            title="Unsafe tag",
        )


def locate(path: str, tag: str | None = None) -> Location:
    """Resolve a user path (and optional tag) to one tag folder, listing the alternatives."""
    path = os.path.abspath(os.path.expanduser(path))
    if not os.path.exists(path):
        raise NotACheckpointError(f"{path} does not exist.", hint="Check the path.")
    if not os.path.isdir(path):
        parent = os.path.dirname(path)
        hint = f"Pass the folder instead: {parent}" if is_tag_dir(parent) else "Pass a checkpoint folder."
        raise NotACheckpointError(f"{path} is a file, not a checkpoint folder.", hint=hint)
    has_latest = os.path.isfile(os.path.join(path, "latest"))  # beside latest_universal: the ZeRO one is read
    if (os.path.isfile(os.path.join(path, "latest_universal")) and not has_latest) or os.path.isdir(
        os.path.join(path, "zero")
    ):
        raise UnsupportedCheckpointError(
            f"{path} is a DeepSpeed universal checkpoint.",
            hint="Reading universal checkpoints is not supported yet; point at the ZeRO checkpoint it came from.",
        )

    if is_tag_dir(path) and not os.path.isfile(os.path.join(path, "latest")):
        root, this = os.path.split(path.rstrip(os.sep))
        if tag is not None and tag != this:
            raise NotACheckpointError(
                f"{path} is itself the tag folder {this!r}; --tag {tag} does not apply.",
                hint=f"Pass the parent folder {root} to choose another tag.",
            )
        tags = list_tags(root) or [this]
        return Location(root, this, tuple(tags), "tag-dir")

    runs = sorted(
        (e.name for e in os.scandir(path) if e.is_dir() and HF_CHECKPOINT_RE.match(e.name)),
        key=_step_key,
        reverse=True,
    )
    if runs and not os.path.isfile(os.path.join(path, "latest")) and not list_tags(path):
        ds_runs = [
            r
            for r in runs
            if os.path.isfile(os.path.join(path, r, "latest")) or list_tags(os.path.join(path, r))
        ]
        if not ds_runs:
            raise NotACheckpointError(
                f"{path} holds Trainer checkpoints ({', '.join(runs[:5])}) but none has DeepSpeed ZeRO files.",
                hint="They were probably saved without DeepSpeed; their weights are already plain files.",
            )
        chosen = ds_runs[0]
        loc = locate(os.path.join(path, chosen), tag)
        note = Finding(
            Severity.INFO,
            "hf-run",
            f"Hugging Face Trainer run with {len(ds_runs)} DeepSpeed checkpoint(s); using the newest, "
            f"{chosen}.",
            hint="Point at another checkpoint-N folder to use it instead.",
        )
        return Location(loc.root, loc.tag, loc.tags, "hf-trainer", (*loc.findings, note), tuple(ds_runs))

    tags = list_tags(path)
    latest = _read_latest(path)
    findings: list[Finding] = []
    if tag is None:
        if latest is not None:
            _check_tag_name(path, latest, f"{os.path.join(path, 'latest')}")
            if not os.path.isdir(os.path.join(path, latest)):
                raise NotACheckpointError(
                    f"`latest` in {path} names the tag {latest!r}, but there is no such folder.",
                    hint=("Available tags: " + ", ".join(tags) + ". Pass one with --tag.")
                    if tags
                    else "The checkpoint seems incomplete: no tag folder holds rank files.",
                )
            tag = latest
        elif tags:
            tag = tags[-1]
            findings.append(
                Finding(
                    Severity.WARNING,
                    "no-latest",
                    f"No `latest` file in {path}; using the newest tag, {tag}.",
                    hint="Pass --tag to choose another.",
                )
            )
        else:
            raise NotACheckpointError(
                f"{path} holds no DeepSpeed checkpoint: no `latest` file and no folder with "
                "*_model_states.pt / *_optim_states.pt files.",
                hint="Point at the folder passed to engine.save_checkpoint(), a global_step* folder inside it, "
                "or a Trainer output folder with checkpoint-N folders.",
            )
    else:
        _check_tag_name(path, tag, "--tag")
        if not os.path.isdir(os.path.join(path, tag)):
            raise NotACheckpointError(
                f"There is no tag {tag!r} in {path}.",
                hint=("Available tags: " + ", ".join(tags)) if tags else "",
            )
    if not is_tag_dir(os.path.join(path, tag)):
        raise NotACheckpointError(
            f"The tag folder {os.path.join(path, tag)} holds no DeepSpeed rank files.",
            hint="The checkpoint was probably not saved completely.",
        )
    if tag not in tags:
        tags.append(tag)
    layout = "lightning" if path.rstrip(os.sep).endswith(".ckpt") else "deepspeed"
    return Location(path, tag, tuple(tags), layout, tuple(findings))
