"""`health --against SPEC`: what to compare with. Another tag of the checkpoint's root (`global_step1`),
another checkpoint's folder (a sibling Trainer `checkpoint-1`, any path), or a folder and a tag in it
(`PATH@TAG`). Resolved to a (root, tag) before anything is read, and said in `--against`'s words, not
`--tag`'s."""

from __future__ import annotations

import os

from inspector.errors import NoSuchTagError, NotACheckpointError
from inspector.scan.locate import SANE_TAG, shown_tag
from inspector.scan.model import Checkpoint
from inspector.scan.scanner import find
from inspector.system.bytesource import is_url
from inspector.text import shown

_HINT = "Give another tag of this checkpoint, another checkpoint's folder, or PATH@TAG."


def against_location(path: str, tag: str | None, spec: str) -> tuple[str, str | None]:
    """(root, tag) that `--against SPEC` names for the checkpoint at `path` (`--tag tag`); None as the tag: the
    one that root's `latest` names. Raises NotACheckpointError naming `--against` when it names nothing."""
    here = find(path, tag)  # any layout's folder: a DCP save is compared with another as a tag with a tag
    if spec in here.tags:
        return here.root, spec
    where, other = _split(spec, here.root)
    if where is None:
        raise NoSuchTagError(
            f"--against {shown(spec)}: no tag of that name in {here.root} (its tags: "
            f"{', '.join(here.tags[:8]) or 'none'}), and no folder of that name.",
            hint=_HINT,
        )
    if other is not None:
        if not SANE_TAG.fullmatch(other) or other in (".", ".."):
            raise NotACheckpointError(
                f"--against names the tag {shown_tag(other)}, which is not a plain folder name.",
                hint="A tag is a folder name such as global_step100. " + _HINT,
                title="Unsafe tag",
            )
        there = find(where)
        if other not in there.tags:
            raise NoSuchTagError(
                f"--against {shown(spec)}: {there.root} has no tag {shown_tag(other)} (its tags: "
                f"{', '.join(there.tags[:8]) or 'none'}).",
                hint=_HINT,
            )
    return where, other


def _split(spec: str, root: str) -> tuple[str | None, str | None]:
    """A path (local or a bucket URL) and the tag after its last `@`, if any; a bare name is also looked for
    beside the root (a Trainer run's `checkpoint-1` beside `checkpoint-2`). (None, None): no such path."""
    tries = [(spec, "")]
    if "@" in spec:
        head, _, tail = spec.rpartition("@")
        tries.append((head, tail))
    for candidate, tag in tries:
        if not candidate:
            continue
        if is_url(candidate) or os.path.exists(candidate):
            return candidate, tag or None
        beside = os.path.join(os.path.dirname(root.rstrip(os.sep)), candidate)
        if os.sep not in candidate and os.path.isdir(beside):
            return beside, tag or None
    return None, None


def against_label(ckpt: Checkpoint, against: Checkpoint | None) -> str | None:
    """How the compared checkpoint is named in the report: its tag, with its folder's name when it is another
    root's (`checkpoint-1/global_step1`), so a comparison across roots never reads as one within."""
    if against is None:
        return None
    if os.path.realpath(against.root) == os.path.realpath(ckpt.root):
        return against.tag
    return f"{os.path.basename(against.root.rstrip(os.sep))}/{against.tag}"
