"""The conversion child's command line and how to explain its end: plain functions, no widgets."""

from __future__ import annotations

import os

from inspector.convert.output import JOURNAL, LOCK, PARTIAL
from inspector.convert.plan import ConvertOptions
from inspector.tui.fmt import size

_KILLED_BY = {
    "SIGKILL": "killed with SIGKILL: by `kill -9`, or by the kernel's OOM killer when memory ran out",
    "SIGTERM": "terminated (SIGTERM)",
    "SIGSEGV": "crashed (SIGSEGV)",
}


def killed_by(signal_name: str) -> str:
    return _KILLED_BY.get(signal_name, f"stopped by {signal_name}")


def convert_args(
    root: str, tag: str, out_dir: str, o: ConvertOptions, *, overwrite: bool, force: bool, kind: str = ""
) -> list[str]:
    """The `convert` command line for these options (the child re-plans exactly what we predicted)."""
    if kind == "universal":  # the whole checkpoint: selection, dtype, shards and renames do not apply
        flags = [f for f, on_ in (("--overwrite", overwrite), ("--force", force)) if on_]
        return ["convert", root, out_dir, "--tag", tag, "--format", "universal", *flags, "--progress", "json"]
    args = ["convert", root, out_dir, "--tag", tag, "--dtype", o.dtype, "--shard-size", str(o.shard_size)]
    for flag, values in (
        ("--include", o.include),
        ("--exclude", o.exclude),
        ("--strip-prefix", o.strip_prefix),
        ("--keep-fp32", o.keep_fp32),
    ):
        for v in values:
            args += [f"{flag}={v}"]
    for pat, repl in o.renames:
        args += [f"--rename={pat}={repl}"]
    for flag, on_ in (
        ("--exclude-frozen", o.exclude_frozen),
        ("--exclude-buffers", o.exclude_buffers),
        ("--dedupe-tied", o.dedupe_tied),
        ("--overwrite", overwrite),
        ("--force", force),
    ):
        if on_:
            args.append(flag)
    args += {"weights": ["--weights-only"], "adapter": ["--adapter"], "merged": ["--merge-adapter"]}.get(
        kind, []
    )
    return [*args, "--progress", "json"]


def left_on_disk(out_dir: str) -> str:
    """What a failed or killed run left behind, and whether a rerun can reuse it."""
    try:
        names = sorted(n for n in os.listdir(out_dir) if n != LOCK)  # the lock is released with the process
    except OSError:
        return "Nothing was written (the output folder does not exist)."
    if not names:
        return f"{out_dir} is empty: nothing is left behind."
    partial = [n for n in names if n.endswith(PARTIAL)]
    parts = [f"{out_dir} holds {len(names)} file(s)"]
    if partial:
        total = sum(os.path.getsize(os.path.join(out_dir, n)) for n in partial)
        parts.append(f"{len(partial)} unfinished *.partial file(s), {size(total)}")
    if JOURNAL in names:
        parts.append("a journal: converting again with the same options reuses the finished shards")
    return "; ".join(parts) + "."
