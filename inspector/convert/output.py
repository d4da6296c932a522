"""The output folder of a conversion: who may write there, what a previous run left, and the journal that
lets a killed run resume. The engine streams bytes; this module owns the folder around them.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil

from inspector.convert.plan import INDEX_NAME, SINGLE_NAME, ConversionPlan
from inspector.errors import InspectorError, OutputError

PARTIAL = ".partial"
JOURNAL = ".zero-inspector-journal.json"
_OUR_NAMES = (SINGLE_NAME, INDEX_NAME)


def ours(name: str) -> bool:
    """Files a previous run of this tool may have left: shards, index, partials, journal."""
    base = name[: -len(PARTIAL)] if name.endswith(PARTIAL) else name
    return (
        base in _OUR_NAMES
        or name == JOURNAL
        or (base.startswith("model-") and base.endswith(".safetensors") and "-of-" in base)
    )


def prepare_output(plan: ConversionPlan, out_dir: str, overwrite: bool) -> list[str]:
    """Check the output folder; returns stale files of ours to remove once the new output is in place."""
    if os.path.exists(out_dir) and not os.path.isdir(out_dir):
        raise OutputError(f"{out_dir} exists and is not a folder.", hint="Choose another output path.")
    real_out = os.path.realpath(out_dir)
    for f in plan.shards[0].tensors[:1]:
        if f.segments and os.path.dirname(os.path.realpath(f.segments[0].file)) == real_out:
            raise OutputError(
                "The output folder is the checkpoint's tag folder.",
                hint="Write the conversion to a separate folder.",
            )
    probe = out_dir
    while not os.path.exists(probe):  # created only when the run starts, so a refusal leaves nothing
        probe = os.path.dirname(probe)
    if not os.access(probe, os.W_OK):
        raise OutputError(f"{probe} is not writable.", hint="Choose a folder you can write to.")
    existing = sorted(os.listdir(out_dir)) if os.path.isdir(out_dir) else []
    foreign = [n for n in existing if not ours(n)]
    finals = [n for n in existing if ours(n) and not n.endswith(PARTIAL) and n != JOURNAL]
    planned = set(plan.filenames)
    # a run of this very job killed while renaming its finished shards may have left some in place
    resumable = read_journal(out_dir).get("job") == plan.fingerprint and set(finals) <= planned
    if (foreign or finals) and not overwrite and not (resumable and not foreign):
        shown = ", ".join((foreign + finals)[:5]) + (" …" if len(foreign + finals) > 5 else "")
        raise OutputError(
            f"{out_dir} is not empty ({shown}).",
            hint="Choose an empty folder, or pass --overwrite to replace model*.safetensors and "
            "the index there (other files are left alone).",
            title="Output folder not empty",
        )
    return [n for n in finals if n not in planned]


def read_journal(out_dir: str) -> dict[str, object]:
    try:
        with open(os.path.join(out_dir, JOURNAL)) as fh:
            data = json.load(fh)
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def write_journal(out_dir: str, plan: ConversionPlan, done: list[str]) -> None:
    tmp = os.path.join(out_dir, JOURNAL + ".tmp")
    with open(tmp, "w") as fh:
        json.dump({"job": plan.fingerprint, "complete": done}, fh)
    os.replace(tmp, os.path.join(out_dir, JOURNAL))


def disk_error(exc: OSError, out_dir: str, need: int) -> InspectorError:
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        free = shutil.disk_usage(out_dir).free
        return OutputError(
            f"Disk full while writing to {out_dir}: the output needs {need:,} bytes, {free:,} are free.",
            hint="Free disk space or choose another output folder; partial files were removed.",
            title="Disk full",
        )
    return OutputError(
        f"Writing to {out_dir} failed: {exc.strerror}.",
        hint="Check the output folder; partial files were removed.",
    )


def valid_partial(path: str, header: bytes, size: int) -> bool:
    """A completed partial from an interrupted run of the same job: right size and identical header."""
    try:
        if os.path.getsize(path) != size:
            return False
        with open(path, "rb") as fh:
            return fh.read(len(header)) == header
    except OSError:
        return False


def fsync_dir(path: str) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
