"""What the command line hands the app (`LaunchOptions`) and which of several roots it opens first
(`newest_root`): plain data and a rule, apart from the app so the CLI and tests read them without Textual."""

from __future__ import annotations

import os
from dataclasses import dataclass

from inspector.convert.options import ConvertOptions

DEMO_PARAMS = "30M"


@dataclass(frozen=True)
class LaunchOptions:
    """What the command line asked for: where to look and how to preset the selection and the export."""

    path: str | None = None
    tag: str | None = None
    options: ConvertOptions | None = None  # convert's flags; include/exclude preset the selection
    out_dir: str | None = None
    overwrite: bool = False
    demo: bool = False
    demo_params: str = DEMO_PARAMS
    tp_split: tuple[tuple[str, str], ...] = ()  # --tp-split: how an unrecorded tensor-parallel split joins
    format: str = ""  # the export form's kind (--format, --adapter, --merge-adapter, --weights-only)
    base: str = ""  # --base: the base model folder a merge reads
    selection: str = ""  # --selection: the named selection (proposed or saved) selected on the first scan


def newest_root(roots: tuple[str, ...]) -> str:
    """The root saved last: Trainer's `checkpoint-N` folders by their step, others by their `latest` file's time
    (else the folder's), so a folder of several runs opens on the newest whatever their names sort as; the last
    one when no time is known (a bucket)."""
    if all(os.path.basename(r).startswith("checkpoint-") for r in roots):
        return roots[-1]  # discover_roots sorts them by step

    def saved(i_root: tuple[int, str]) -> tuple[float, int]:
        i, root = i_root
        for path in (os.path.join(root, "latest"), root):
            try:
                return os.stat(path).st_mtime, i
            except (OSError, ValueError):
                continue
        return 0.0, i

    return max(enumerate(roots), key=saved)[1]
