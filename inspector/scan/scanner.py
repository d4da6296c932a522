"""Scan a checkpoint into a `Checkpoint`: metadata only, no tensor data.

The layouts (`scan/layouts/`, one package each behind `LAYOUTS`) decide what a folder is: first a layout
with folders of its own (a universal checkpoint, a DCP folder) may find it; otherwise the DeepSpeed walk
(`locate`) picks the tag folder and the first layout that claims it scans it. A folder nothing claims is
refused as not supported yet, with what was recognised in it: never called damaged.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from inspector.errors import UnsupportedCheckpointError
from inspector.scan.layouts import LAYOUTS, Found, Layout, ScanOptions
from inspector.scan.locate import EXPERT_RE, EXPP_RE, LAYER_RE, MODEL_RE, OPTIM_RE, ZERO3_MODEL_RE, locate
from inspector.scan.model import Checkpoint


def scan(path: str, tag: str | None = None, *, tp_split: tuple[tuple[str, str], ...] = ()) -> Checkpoint:
    """Scan `path` (root, tag folder, Trainer run, Lightning .ckpt or universal checkpoint) into a `Checkpoint`.
    `tp_split`: (glob, rule) pairs saying how a tensor-parallel checkpoint that records no split joins its
    shards (rule `0`, `1` or `replicated`); the first glob a parameter name matches applies."""
    start = time.process_time()
    layout, found = _find(path, tag)
    layout = layout or next((x for x in LAYOUTS if x.claims(found)), None)
    if layout is None:
        raise refusal(found)
    ckpt = layout.scan(found, ScanOptions(tp_split))
    # set once, here, on the record just built (as `__post_init__` sets its index): what it cost to read
    object.__setattr__(ckpt, "scan_cpu", time.process_time() - start)
    return ckpt


def find(path: str, tag: str | None = None) -> Found:
    """Which folder (and tag) `path` means, and its names, without reading a rank file: what the app shows
    while the scan runs (the tags to choose from)."""
    return _find(path, tag)[1]


def _find(path: str, tag: str | None) -> tuple[Layout | None, Found]:
    """A layout's own folder (universal, DCP) and that layout, else the tag folder the DeepSpeed walk picks
    (no layout yet: the layouts' claims decide)."""
    from inspector.remote.roots import source_at

    source = source_at(path, "checkpoint")  # local folder or bucket prefix: decided once, here
    for layout in LAYOUTS:
        if (own := layout.locate(path, tag, source)) is not None:
            return layout, own
    return None, Found.of(locate(path, tag, source))


# what a rank file's name says it is, for the refusal (the first pattern a name matches)
_KINDS = (
    (LAYER_RE, "pipeline layer file"),
    (EXPERT_RE, "expert file"),
    (EXPP_RE, "expert-parallel optimizer file"),
    (ZERO3_MODEL_RE, "ZeRO-3 model-states file"),
    (OPTIM_RE, "optimizer-states file"),
    (MODEL_RE, "model-states file"),
)


def recognised(names: Sequence[str]) -> str:
    """The DeepSpeed files among `names`, counted by kind (`2 optimizer-states files, 1 model-states file`);
    other names are counted, never shown (they come from the folder)."""
    from inspector.system.units import plural

    counts: dict[str, int] = {}
    for n in names:
        what = next((w for rx, w in _KINDS if rx.match(n)), "other file")
        counts[what] = counts.get(what, 0) + 1
    order = [w for _, w in _KINDS] + ["other file"]
    return ", ".join(plural(counts[w], w) for w in order if w in counts) or "no files"


def refusal(found: Found) -> UnsupportedCheckpointError:
    """No layout claims the tag folder: say what it holds and which layouts were tried. Not "damaged": a
    layout the tool does not know is not evidence of damage."""
    known = ", ".join(layout.name for layout in LAYOUTS)
    # what a layout found out while declining (kept in the memo), e.g. pre-0.6 expert file names
    why = [f" {v.message}" for v in found.memo.values() if isinstance(v, UnsupportedCheckpointError)]
    return UnsupportedCheckpointError(
        f"{found.tag_dir}: this checkpoint layout is not supported yet. Recognised: "
        f"{recognised(found.names)}; no layout it knows ({known}) claims that combination.{''.join(why)}",
        hint="Nothing was written. Please report which DeepSpeed features the run used, so it can be added.",
    )
