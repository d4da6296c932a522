"""The output kinds, one module each, and the one registry the front ends go through.

    base.py         the protocol: OutputKind (offer, plan, owns, verify) and Job (assess, comparisons, run,
                    on top of convert/job.py's OutputJob: files, check_output, writer); Offer, Request
    safetensors.py  what the four safetensors kinds share: SafetensorsJob (engine + side files) and verify
    weights.py  model.py  adapter.py  merged/  universal/

A sixth kind is a module with an OutputKind subclass and a line in KINDS.
"""

from __future__ import annotations

from inspector.convert.kinds.adapter import Adapter
from inspector.convert.kinds.base import Job, Offer, OutputKind, Request
from inspector.convert.kinds.merged import Merged
from inspector.convert.kinds.model import Model
from inspector.convert.kinds.universal import Universal
from inspector.convert.kinds.weights import Weights
from inspector.errors import InvalidOptionError
from inspector.scan.model import Checkpoint

KINDS: tuple[OutputKind, ...] = (Weights(), Model(), Adapter(), Merged(), Universal())
DEFAULT = "model"

__all__ = ["DEFAULT", "KINDS", "Job", "Offer", "OutputKind", "Request", "get", "names", "of_output", "offers"]


def names() -> tuple[str, ...]:
    return tuple(k.name for k in KINDS)


def get(name: str) -> OutputKind:
    for k in KINDS:
        if k.name == name:
            return k
    raise InvalidOptionError(
        f"Unknown output kind {name!r}.",
        hint="Choose one of: " + ", ".join(names()) + ".",
    )


def offers(ckpt: Checkpoint) -> list[Offer]:
    """What can be written for this checkpoint, in the registry's order, each with why not."""
    return [k.offer(ckpt) for k in KINDS]


def of_output(out_dir: str) -> OutputKind:
    """The kind of the output in `out_dir` (for verify): the most specific kind that claims it."""
    for k in reversed(KINDS):  # universal, merged, then the plain safetensors kinds
        if k.owns(out_dir):
            return k
    return get(DEFAULT)
