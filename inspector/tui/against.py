"""What the Health tab can compare the shown tag with (`a`): the root's other tags, newest first, then the
other roots of the root bar; and the default, the tag saved just before (checkpoint-N against N-1 in a
Trainer run), never a newer one. Values are `health --against` specs, read by the CLI's own
`health.against.against_location`. Plain data: no widgets."""

from __future__ import annotations

import os

from rich.text import Text

from inspector.scan.model import Checkpoint
from inspector.tui.fmt import shown

NO_COMPARISON = ""


def against_choices(ckpt: Checkpoint, roots: tuple[str, ...]) -> list[tuple[Text | str, str]]:
    """(label, spec) per thing to compare with: nothing, the other tags, the other roots (by their latest)."""
    choices: list[tuple[Text | str, str]] = [("nothing (this tag alone)", NO_COMPARISON)]
    choices += [(Text(shown(t)), t) for t in reversed(ckpt.tags) if t != ckpt.tag]
    others = [r for r in roots if os.path.realpath(r) != os.path.realpath(ckpt.root)]
    if others:
        common = os.path.commonpath([ckpt.root, *others])
        choices += [
            (Text(shown(f"root {os.path.relpath(r, common)}")), os.path.abspath(r)) for r in reversed(others)
        ]
    return choices


def default_against(ckpt: Checkpoint, roots: tuple[str, ...]) -> str:
    """The tag saved just before this one in its root, else (a Trainer run's oldest tag) the previous
    checkpoint-N root; nothing when there is none: never a newer tag against an older one."""
    tags = list(ckpt.tags)
    if ckpt.tag in tags and tags.index(ckpt.tag) > 0:
        return tags[tags.index(ckpt.tag) - 1]
    if roots and all(os.path.basename(r.rstrip(os.sep)).startswith("checkpoint-") for r in roots):
        real = [os.path.realpath(r) for r in roots]  # discover_roots sorts a Trainer run's by step
        here = os.path.realpath(ckpt.root)
        if here in real and real.index(here) > 0:
            return os.path.abspath(roots[real.index(here) - 1])
    return NO_COMPARISON
