"""The conversion child's order and command line, and how to explain its end: plain functions, no widgets."""

from __future__ import annotations

import os
from typing import Any

from rich.text import Text

from inspector.convert.events import Failed, Finished, Started, Verified
from inspector.convert.journal import JOURNAL
from inspector.convert.order import Order
from inspector.convert.outnames import entries
from inspector.convert.root import LOCK, PARTIAL
from inspector.system.bytesource import is_url
from inspector.tui.fmt import plural, shown, size, took

_KILLED_BY = {
    "SIGKILL": "killed with SIGKILL: by `kill -9`, or by the kernel's OOM killer when memory ran out",
    "SIGTERM": "terminated (SIGTERM)",
    "SIGSEGV": "crashed (SIGSEGV)",
}


def killed_by(signal_name: str) -> str:
    return _KILLED_BY.get(signal_name, f"stopped by {signal_name}")


def app_order(app: Any, out_dir: str, *, force: bool) -> Order:
    """The conversion the app previews and the child carries out, as one frozen order: the selection as
    convert's include/exclude, the export options, the chosen kind."""
    from inspector.convert.kinds import DEFAULT, Request

    ckpt = app.ckpt
    return Order(
        path=ckpt.root,
        out=out_dir,
        kind=app.export.format or DEFAULT,
        tag=ckpt.tag,
        request=Request(app.convert_options(), base=form_base(app), allow_damaged=force),
        overwrite=app.export.overwrite,
        executor=app.export.executor or "local",
        ray_address=app.export.ray_address or None,
        tp_split=tuple(app.tp_split),  # the child scans as the app did
    )


def form_base(app: Any) -> str | None:
    """The export form's base model folder when its kind reads one (`--base`), else None: a folder typed
    for a merge does not make a plain export an error, as `--base` with another kind is in the CLI."""
    from inspector.convert.kinds import DEFAULT, get

    return (app.export.base or None) if get(app.export.format or DEFAULT).takes_base else None


def run_preflight(app: Any, opts: Any, out_dir: str, ram: str = "") -> tuple[Any, Any]:
    """Plan the chosen output kind and assess it (in a worker), as `preflight --format KIND` does; `ram`
    (the form's "Fits in RAM", as typed and checked) judges it for a node of that size, as `preflight --ram` does."""
    from inspector.convert.bucket import plan_output
    from inspector.convert.kinds import DEFAULT, Request, get
    from inspector.system.budget import chosen_budget
    from inspector.system.units import parse_size

    kind = get(app.export.format or DEFAULT)
    request = Request(opts, base=form_base(app), allow_damaged=True)
    job = plan_output(kind, app.ckpt, request, out_dir or os.getcwd())
    if ram:
        return job, job.assess(chosen_budget(parse_size(ram), ram))
    frozen = getattr(app, "frozen_assess", None)  # snapshots and screenshots: fixed machine figures
    return job, frozen(job) if frozen else job.assess()


def child_args(order: Order) -> list[str]:
    """The child's command line: the order itself goes on its stdin (`to_json`), so it plans exactly what
    the app planned; path and OUT are repeated so `ps` shows what it works on."""
    return ["convert", order.path, order.out, "--order", "-", "--progress", "json"]


def plan_mismatch(started: Started, job: Any) -> str:
    """Why the child's plan is not the one the app previewed ("" when it is): the app does not go on."""
    if started.plan == job.identity:
        return ""
    return (
        f"The converter planned a different job ({started.plan or 'unknown'}) than the preview "
        f"({job.identity}): the checkpoint or the output folder changed since."
    )


def _tree_size(path: str) -> int:
    """A file's size, or the bytes of every file under a folder (the universal writer's `.partial/`)."""
    if not os.path.isdir(path):
        return os.path.getsize(path)
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(path) for f in fs)


def left_on_disk(out_dir: str) -> str:
    """What a failed or killed run left behind, and whether a rerun can reuse it."""
    if is_url(out_dir):  # the run aborted its open uploads and removed what it had uploaded
        return f"Nothing of this run is left in {out_dir}."
    try:  # the lock is released with the process; a part starting beside this one may show its write probe
        names = [n for n in entries(out_dir) if n != LOCK] if os.path.isdir(out_dir) else None
    except OSError:
        names = None
    if names is None:
        return "Nothing was written (the output folder does not exist)."
    if not names:
        return f"{out_dir} is empty: nothing is left behind."
    partial = [n for n in names if n.endswith(PARTIAL)]
    parts = [f"{out_dir} holds {plural(len(names), 'file')}"]
    if partial:
        total = sum(_tree_size(os.path.join(out_dir, n)) for n in partial)
        parts.append(f"{plural(len(partial), 'unfinished *.partial file')}, {size(total)}")
    if JOURNAL in names:
        parts.append("a journal: converting again with the same options reuses the finished shards")
    return "; ".join(parts) + "."


def done_text(r: Finished, peak: int, predicted: int, planned_files: int = 0) -> Text:
    """The result line of a finished conversion, from the child's `report` event. `planned_files`: what the plan
    listed, when the report names fewer entries (a universal folder reported as one): the count said is the
    plan's, with the folder named, not "1 file"."""
    files = [(str(f[0]), int(f[1])) for f in r.files if len(f) == 2]
    secs, written = r.seconds, r.bytes_written
    where = (
        f"{planned_files} files in {', '.join(n + '/' for n, _ in files)}"
        if planned_files > len(files) and files
        else plural(len(files), "file")
    )
    return Text.assemble(
        ("✔ Done", "bold green"),
        f" in {took(secs)}: {plural(r.tensors, 'tensor')}, {size(written)}"
        f" in {where} at {size(written / max(secs, 1e-9))}/s;"
        f" peak RSS {size(peak)}" + (f" (predicted {size(predicted)})" if predicted else "") + ".",
        (
            f" {plural(r.resumed_files, 'file')} reused from an earlier run (kept, not written again)."
            if r.resumed_files
            else ""
        ),
        "\n",
        ("\n".join(f"  {shown(name)}  {size(n)}" for name, n in files[:8]), "dim"),
        ("\n  …" if len(files) > 8 else ""),
        ("\nv verifies every byte against the checkpoint · b goes back", "bold"),
    )


def failure_text(title: str, message: str, hint: str, *, error: bool = True) -> Text:
    return Text.assemble(
        ("✖ " if error else "■ ", "bold red" if error else "bold yellow"),
        (title, "bold"),
        f"\n{message}",
        (f"\n→ {hint}", "italic"),
        ("\nb goes back; c there tries again.", "dim"),
    )


def verified_text(r: Verified) -> Text:
    """The line of a verification that passed, from the child's `verified` event."""
    return Text.assemble(
        ("✔ Verified: ", "bold green"),
        f"{plural(r.checked, 'tensor')}, {size(r.bytes_checked)} "
        f"identical to the checkpoint after conversion (checked in {took(r.seconds)}).",
    )


def explain_exit(
    returncode: int,
    cancelled: bool,
    error_event: Failed | None,
    stderr: str,
    peak: int,
    out_dir: str,
    *,
    resumable: bool = False,
) -> tuple[str, str, str]:
    """Title, message and hint for a conversion child that did not finish. `resumable`: the universal
    writer, which keeps its finished files in `<tag>_uni.partial/` so the same conversion resumes."""
    from inspector.tui.child import signal_name

    if cancelled and resumable:
        return (
            "Cancelled",
            "The conversion was cancelled; the files finished so far are kept in the *.partial folder.",
            f"{left_on_disk(out_dir)} Converting again with the same output folder resumes.",
        )
    if cancelled:
        return (
            "Cancelled",
            "The conversion was cancelled; the converter removed its partial output.",
            left_on_disk(out_dir),
        )
    sig = signal_name(returncode)
    if sig:
        return (
            "The converter was killed",
            f"The conversion process was {killed_by(sig)}. It had no chance "
            f"to clean up. Peak RSS seen: {size(peak)}.",
            left_on_disk(out_dir),
        )
    ev = error_event
    title = (ev.title if ev else "") or "The conversion failed"
    message = (ev.message if ev else "") or stderr.strip()[-800:] or f"exit code {returncode}"
    return title, message, " ".join(x for x in ((ev.hint if ev else ""), left_on_disk(out_dir)) if x)
