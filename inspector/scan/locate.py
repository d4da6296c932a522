"""Find the checkpoint a user means: a root with `latest`, a tag folder, an HF Trainer run, a Lightning .ckpt.

Pure path logic and file classification; nothing is unpickled here. Every question about the tree is asked
of one byte source, chosen once from what the user named (`remote.roots.source_at`, by the caller or, when
none is given, here): a local folder and a bucket prefix answer the same questions.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field

from inspector.errors import (
    InspectorError,
    NoSuchTagError,
    NotACheckpointError,
    StoreError,
    UnsupportedCheckpointError,
)
from inspector.parse.names import name_problem
from inspector.scan.model import Finding, Severity
from inspector.system.bytesource import ByteSource
from inspector.system.source import os_error
from inspector.text import command_hint, shown

# Numbers in rank-file names as DeepSpeed spells them: `{:02d}` (mp_rank_MM, layer_XX, model_TT) is two digits
# or more (`mp_rank_100`, `layer_100`), `{}` (zero_pp_rank_R, expp_rank_E, expert_E, layer_L_) has no padding.
# One spelling per number, so `mp_rank_000` cannot stand in for (and silently replace) `mp_rank_00`; at most 18
# digits, so a crafted name's number stays a cheap machine-sized int, which the scans then bound by the files
# present. A longer number is not a rank file at all, nor are other scripts' digits (`\d` takes Arabic-Indic
# `00`, which int() reads as 0: a second spelling of rank 0).
PADDED = r"([0-9]{2}|[1-9][0-9]{2,17})"
PLAIN = r"(0|[1-9][0-9]{0,17})"
OPTIM_RE = re.compile(rf"^(bf16_|fp16_)?zero_pp_rank_{PLAIN}_mp_rank_{PADDED}_?optim_states\.pt$")
ZERO3_MODEL_RE = re.compile(rf"^zero_pp_rank_{PLAIN}_mp_rank_{PADDED}_model_states\.pt$")
MODEL_RE = re.compile(rf"^mp_rank_{PADDED}_model_states\.pt$")
LAYER_RE = re.compile(rf"^layer_{PADDED}-model_.*\.pt$")
EXPERT_RE = re.compile(rf"^(layer_{PLAIN}_)?expert_{PLAIN}_mp_rank_{PADDED}_model_states\.pt$")
EXPP_RE = re.compile(rf"^expp_rank_{PLAIN}_mp_rank_{PADDED}_optim_states\.pt$")
HF_CHECKPOINT_RE = re.compile(r"^checkpoint-(\d+)$")


def _step_key(name: str) -> tuple[int, str]:
    m = re.search(r"(\d+)$", name)
    return (int(m.group(1)) if m else -1, name)


def is_tag_dir(src: ByteSource, path: str) -> bool:
    """A folder holding DeepSpeed rank files."""
    try:
        names = src.names_in(path)
    except OSError:
        return False
    return any(OPTIM_RE.match(n) or MODEL_RE.match(n) or ZERO3_MODEL_RE.match(n) for n in names)


def list_tags(src: ByteSource, root: str) -> list[str]:
    """Tag folders under a root, oldest first (numeric order of the trailing step)."""
    try:
        subdirs = src.subdirs(root)
    except OSError:
        return []
    return sorted(
        (d for d in subdirs if not name_problem(d) and is_tag_dir(src, os.path.join(root, d))), key=_step_key
    )


@dataclass(frozen=True)
class Location:
    """Where the chosen tag lives and how we got there."""

    root: str
    tag: str
    tags: tuple[str, ...]
    layout: str
    findings: tuple[Finding, ...] = ()
    other_runs: tuple[str, ...] = field(default=())
    # the folder (or bucket prefix) every file of this checkpoint is read through, of the kind chosen once
    source: ByteSource = field(kw_only=True, compare=False, repr=False)

    @property
    def tag_dir(self) -> str:
        return os.path.join(self.root, self.tag)


# A tag DeepSpeed or a user would write (global_step100, step-5_final, v1.2). Anything else in `latest` is
# never shown: the file may be a link to /etc/passwd or /proc/self/environ.
SANE_TAG = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+@=,-]{0,127}")
_LATEST_MAX = 4096


def shown_tag(tag: str) -> str:
    """A tag as it may appear in a message: itself if it is a sane name, else its escaped form."""
    return tag if SANE_TAG.fullmatch(tag) else ascii(tag)


def _unsafe_latest(path: str, why: str) -> NotACheckpointError:
    return NotACheckpointError(
        f"{path} {why}; it was not followed and its contents are not shown.",
        hint="`latest` must be a small text file inside the checkpoint naming a tag folder such as "
        "global_step100. Fix it, or pass --tag.",
        title="Unsafe tag",
    )


def read_tag_file(src: ByteSource, root: str, name: str) -> str | None:
    """The tag named by `root/<name>` (`latest`, `latest_universal`), read through the confined source only
    if it is a small regular file inside the root; its content is never shown (it may be a link to
    /proc/self/environ), only whether it is a plain tag name."""
    path = os.path.join(root, name)
    source = src.rooted(root, "checkpoint")
    kind = source.kind(path)  # links resolved, confined to the root: "outside" for a link out of it
    if kind == "dir" or (kind == "missing" and not source.lexists(path)):
        return None  # no such file (a dangling link is one, refused below), or a folder called `latest`
    if kind == "outside":
        raise _unsafe_latest(path, "is a link to a file outside the checkpoint")
    if kind != "file":
        raise _unsafe_latest(path, "is not a regular file")
    try:
        raw = source.read_bytes(path, _LATEST_MAX, "tag name")
    except StoreError:
        raise  # the store refused (credentials, throttling): the file itself may be fine
    except InspectorError:
        raise _unsafe_latest(path, "is too large or unreadable") from None
    try:
        tag = raw.decode("utf-8").strip()
    except UnicodeDecodeError:
        raise _unsafe_latest(path, "is not text") from None
    if not SANE_TAG.fullmatch(tag) or name_problem(tag):
        raise _unsafe_latest(path, "does not hold a plain tag name")
    return tag


def _read_latest(src: ByteSource, root: str) -> str | None:
    return read_tag_file(src, root, "latest")


def _check_tag_name(src: ByteSource, root: str, tag: str, source: str) -> None:
    bad = bool(name_problem(tag))
    if not bad and not src.remote:  # a store has no links to follow out; the name rule is the check
        # a source rooted at a folder holds it with its links resolved: the tag's must sit in the root's
        bad = os.path.dirname(src.rooted(os.path.join(root, tag)).root) != src.rooted(root).root
    if bad:
        raise NotACheckpointError(
            f"{source} names the tag {shown_tag(tag)}, which is not a folder directly inside {root}.",
            hint="A tag must be a plain folder name such as global_step100. Refusing to follow paths out of "
            "the checkpoint; fix the file or pass --tag.",
            title="Unsafe tag",
        )


def locate(path: str, tag: str | None, source: ByteSource) -> Location:
    """Resolve a user path (and optional tag) to one tag folder, listing the alternatives. `source`: the byte
    source chosen for what the user named (`remote.roots.source_at`), asked every question about the tree."""
    src = source
    path = src.absolute(path)
    _check_folder(src, path)
    if is_tag_dir(src, path) and src.entry(os.path.join(path, "latest")) != "file":
        root, this = os.path.split(path.rstrip(os.sep))
        if src.remote and root.endswith(":/"):
            raise NotACheckpointError(
                f"{shown(path)} is a bucket whose top level is a tag folder.",
                hint="Move the checkpoint under a prefix (s3://bucket/run/global_step100/...).",
            )
        if tag is not None and tag != this:
            raise NotACheckpointError(
                f"{path} is itself the tag folder {shown_tag(this)}; --tag {shown_tag(tag)} does not apply.",
                hint=f"Pass the parent folder {root} to choose another tag.",
            )
        tags = list_tags(src, root) or [this]
        return Location(root, this, tuple(tags), "tag-dir", source=src.rooted(root, "checkpoint"))
    trainer = _trainer_run(src, path, tag)
    if trainer is not None:
        return trainer
    tags = list_tags(src, path)
    tag, findings = _choose_tag(src, path, tag, tags)
    if not is_tag_dir(src, os.path.join(path, tag)):
        raise NotACheckpointError(
            f"The tag folder {os.path.join(path, tag)} holds no DeepSpeed rank files.",
            hint="The checkpoint was probably not saved completely.",
        )
    if tag not in tags:
        tags.append(tag)
    layout = "lightning" if path.rstrip(os.sep).endswith(".ckpt") else "deepspeed"
    source = src.rooted(path, "checkpoint")
    return Location(path, tag, tuple(tags), layout, tuple(findings), source=source)


def _check_folder(src: ByteSource, path: str) -> None:
    """An existing folder that is not a universal checkpoint."""
    kind = src.entry(path)
    if kind == "missing":
        raise NotACheckpointError(f"{path} does not exist.", hint="Check the path.")
    if kind != "dir":
        parent = os.path.dirname(path)
        hint = f"Pass the folder instead: {parent}" if is_tag_dir(src, parent) else "Pass a checkpoint folder."
        raise NotACheckpointError(f"{path} is a file, not a checkpoint folder.", hint=hint)
    has_latest = src.entry(os.path.join(path, "latest")) == "file"  # beside latest_universal: ZeRO's is read
    if (src.entry(os.path.join(path, "latest_universal")) == "file" and not has_latest) or src.entry(
        os.path.join(path, "zero")
    ) == "dir":
        raise UnsupportedCheckpointError(
            f"{path} is a DeepSpeed universal checkpoint.",
            hint="Reading universal checkpoints is not supported yet; point at the ZeRO checkpoint it came from.",
        )


def _trainer_run(src: ByteSource, path: str, tag: str | None) -> Location | None:
    """A Hugging Face Trainer output folder: its newest checkpoint-N with DeepSpeed files (None if not one)."""
    try:
        runs = sorted(
            (name for name in src.subdirs(path) if HF_CHECKPOINT_RE.match(name)),
            key=_step_key,
            reverse=True,
        )
    except OSError as exc:
        raise os_error(path, exc) from None
    if not runs or _has_latest(src, path) or list_tags(src, path):
        return None
    ds_runs = [r for r in runs if _has_latest(src, os.path.join(path, r)) or list_tags(src, os.path.join(path, r))]
    if not ds_runs:
        raise NotACheckpointError(
            f"{path} holds Trainer checkpoints ({', '.join(runs[:5])}) but none has DeepSpeed ZeRO files.",
            hint="They were probably saved without DeepSpeed; their weights are already plain files.",
        )
    chosen = ds_runs[0]
    loc = locate(os.path.join(path, chosen), tag, src)
    note = Finding(
        Severity.INFO,
        "hf-run",
        f"Hugging Face Trainer run with {len(ds_runs)} DeepSpeed checkpoint(s); using the newest, {chosen}.",
        hint="Point at another checkpoint-N folder to use it instead.",
    )
    findings = (*loc.findings, note)
    return Location(loc.root, loc.tag, loc.tags, "hf-trainer", findings, tuple(ds_runs), source=loc.source)


def _has_latest(src: ByteSource, folder: str) -> bool:
    return src.entry(os.path.join(folder, "latest")) == "file"


def _choose_tag(src: ByteSource, path: str, tag: str | None, tags: list[str]) -> tuple[str, list[Finding]]:
    """The tag to read under a root: --tag, else the one `latest` names, else the newest (with a warning)."""
    if tag is not None:
        _check_tag_name(src, path, tag, "--tag")
        if src.entry(os.path.join(path, tag)) != "dir":
            raise NoSuchTagError(
                f"There is no tag {shown_tag(tag)} in {path}.",
                hint=("Available tags: " + ", ".join(tags)) if tags else "",
            )
        return tag, []
    latest = _read_latest(src, path)
    if latest is not None:
        _check_tag_name(src, path, latest, f"{os.path.join(path, 'latest')}")
        if src.entry(os.path.join(path, latest)) != "dir":
            raise NoSuchTagError(
                f"`latest` in {path} names the tag {latest}, but there is no such folder.",
                hint=("Available tags: " + ", ".join(tags) + ". Pass one with --tag.")
                if tags
                else "The checkpoint seems incomplete: no tag folder holds rank files.",
            )
        return latest, []
    if tags:
        newest = tags[-1]
        note = Finding(
            Severity.WARNING,
            "no-latest",
            f"No `latest` file in {path}; using the newest tag, {newest}.",
            hint="Pass --tag to choose another.",
        )
        return newest, [note]
    below = [os.path.relpath(r, path) for r in discover_roots(path, src) if r != path]
    if below:  # a Lightning run folder (`last.ckpt/`), an RLHF run: name what is inside
        listed = ", ".join(shown(b) + "/" for b in below[:5]) + (" …" if len(below) > 5 else "")
        raise NotACheckpointError(
            f"{path} is not itself a DeepSpeed checkpoint, but it holds {len(below)}: {listed}",
            hint=f"Pass one of them, e.g. {os.path.join(path, below[0])}; `{command_hint(path)}` opens the "
            "app with all of them to choose from.",
        )
    raise NotACheckpointError(
        f"{path} holds no DeepSpeed checkpoint: no `latest` file and no folder with "
        "*_model_states.pt / *_optim_states.pt files.",
        hint="Point at the folder passed to engine.save_checkpoint(), a global_step* folder inside it, "
        "or a Trainer output folder with checkpoint-N folders.",
    )


def discover_roots(path: str, source: ByteSource, max_depth: int = 2) -> tuple[str, ...]:
    """Checkpoint roots in a folder that holds several (an RLHF run's `_actor/` and `_critic/`, a Trainer
    run's `checkpoint-N/` folders), in natural order; `(path,)` when `path` is one checkpoint by itself and
    `()` when nothing below it looks like a checkpoint. Pure path logic, additive to `locate`."""
    src = source
    path = src.absolute(path)
    if src.entry(path) != "dir":
        return ()
    if _has_latest(src, path) or is_tag_dir(src, path) or list_tags(src, path):
        return (path,)
    found: list[str] = []

    def walk(folder: str, depth: int) -> None:
        try:
            subdirs = sorted(src.subdirs(folder), key=_natural_key)
        except OSError:
            return
        for name in subdirs:
            if name_problem(name):  # a crafted folder name (terminal escapes) is not a checkpoint: not listed
                continue
            sub = os.path.join(folder, name)
            if (
                _has_latest(src, sub)
                or list_tags(src, sub)
                or (HF_CHECKPOINT_RE.match(name) and is_tag_dir(src, sub))
            ):
                found.append(sub)
            elif depth > 1 and not is_tag_dir(src, sub):
                walk(sub, depth - 1)

    walk(path, max_depth)
    return tuple(found)


def _natural_key(name: str) -> list[tuple[int, int | str]]:
    """`layers.2` before `layers.10`: digit runs compare as numbers."""
    return [(0, int(p)) if p.isdigit() else (1, p) for p in re.split(r"(\d+)", name) if p]
