"""`convert --format universal`: write a DeepSpeed universal checkpoint with a live byte count."""

from __future__ import annotations

import argparse
import os
import threading
import time
from typing import Any

from rich.markup import escape

from inspector.errors import CancelledError, DamagedCheckpointError


def convert_universal(args: argparse.Namespace) -> int:
    from inspector.cli.console import console as _console
    from inspector.convert.writers.universal import write_universal
    from inspector.system.rss import peak_rss
    from inspector.system.units import format_bytes

    console = _console()
    ckpt, plan = checked_plan(args)
    total = plan.total_bytes
    console.print(
        f"Writing universal checkpoint [bold]{escape(plan.out_dir)}[/] from {escape(ckpt.tag_dir)} "
        f"(ZeRO-{ckpt.stage}, {ckpt.world_size} rank{'s' if ckpt.world_size != 1 else ''}): {len(plan.files)} tensor files, {format_bytes(total)}"
    )
    done = [0]
    lock = threading.Lock()

    def progress(n: int) -> None:
        with lock:
            done[0] += n

    start = time.monotonic()
    result: list[object] = []
    error: list[BaseException] = []
    cancel = threading.Event()

    finished = threading.Event()

    def work() -> None:
        try:
            result.append(write_universal(plan, overwrite=args.overwrite, cancel=cancel, progress=progress))
        except BaseException as exc:
            error.append(exc)
        finally:
            finished.set()

    t = threading.Thread(target=work, name="zi-universal", daemon=True)
    with console.status("Writing…") as status:
        t.start()
        try:
            # an Event, not t.join(timeout): a join interrupted by a signal may later return while the
            # thread still runs (so the lock and the staging folder were left behind on SIGTERM)
            while not finished.wait(0.25):
                status.update(f"Writing… {format_bytes(done[0])} / {format_bytes(total)}")
        except KeyboardInterrupt:  # Ctrl-C, or SIGTERM (cli.main turns it into KeyboardInterrupt)
            cancel.set()  # finished files stay in <tag>_uni.partial/; the same command resumes
            finished.wait()  # the writer removes its half-written files and releases OUT's lock
            raise CancelledError(
                f"Interrupted; the files finished so far are kept in {plan.out_dir}.partial.",
                hint="Rerun the same command to resume.",
            ) from None
    if error:
        raise error[0]
    secs = time.monotonic() - start
    report = result[0]
    reused = getattr(report, "reused", 0)
    console.print(
        f"[green]Done[/] in {secs:.1f} s: {escape(plan.out_dir)} and {escape(os.path.join(plan.out_root, 'latest_universal'))}"
        f", {format_bytes(done[0])} written, peak RSS {format_bytes(peak_rss())}"
        + (f", {reused} file(s) reused from an interrupted run" if reused else "")
        + '.\nResume with DeepSpeed: "checkpoint": {"load_universal": true} and '
        f"engine.load_checkpoint({escape(plan.out_root)!r})."
    )
    return 0


def verify_universal_cli(args: argparse.Namespace, folder: str) -> int:
    from inspector.cli.console import console as _console
    from inspector.convert.writers.universal_verify import UniversalVerifyResult, verify_universal
    from inspector.scan.scanner import scan
    from inspector.scan.universal import scan_universal
    from inspector.system.units import format_bytes

    console = _console()
    src = scan(args.path, args.tag)
    uni = scan_universal(folder)
    result = None
    start = time.monotonic()
    with console.status("Verifying…") as status:
        last = 0.0
        for ev in verify_universal(src, uni):
            if isinstance(ev, UniversalVerifyResult):
                result = ev
            elif time.monotonic() - last > 0.25:
                last = time.monotonic()
                status.update(f"Verifying {ev.tensor} ({ev.bytes_done * 100 // max(ev.bytes_total, 1)}%)…")
    assert result is not None
    for label, names in (
        ("Mismatched", result.mismatched),
        ("Unexpected (not in the checkpoint)", result.unexpected),
        ("Missing from the output", result.missing),
    ):
        if names:
            more = " …" if len(names) > 20 else ""
            console.print(f"[bold red]{label}[/] ({len(names)}): " + escape(", ".join(names[:20])) + more)
    if result.ok:
        console.print(
            f"[green]OK[/]: universal checkpoint {escape(folder)}: {result.checked} tensors "
            f"(fp32 masters, exp_avg, exp_avg_sq, frozen), {format_bytes(result.bytes_checked)}, the step and "
            f"the model-states copies identical to the checkpoint ({time.monotonic() - start:.1f} s)."
        )
        return 0
    console.print("[bold red]Verification failed.[/]")
    return 1


def preflight_universal_cli(args: argparse.Namespace) -> int:
    import json

    from inspector.cli.console import console as _console
    from inspector.convert.writers.universal import plan_universal
    from inspector.convert.writers.universal_preflight import estimate_universal
    from inspector.errors import EXIT_DOES_NOT_FIT
    from inspector.scan.scanner import scan
    from inspector.system.units import format_bytes as fb

    ckpt = scan(args.path, args.tag)
    plan = plan_universal(ckpt, os.path.abspath(args.out or os.getcwd()))
    rank0 = ckpt.ranks[0].optim_bytes if ckpt.stage == 3 and ckpt.ranks else 0
    est = estimate_universal(plan, stage3_rank0_optim=rank0)
    if args.json:
        print(json.dumps(est.as_dict(), indent=1))
    else:
        verdict = "[green]fits[/]" if est.fits else "[bold red]does not fit[/]"
        _console().print(
            f"Universal checkpoint {escape(plan.out_dir)}: {verdict}\n"
            f"  peak RSS   {fb(est.predicted_peak_rss)} of {fb(est.available_memory)} available "
            f"({escape(est.memory_source)})\n"
            f"  disk       {fb(est.output_bytes)} of {fb(est.free_disk)} free "
            f"(DeepSpeed's ds_to_universal peaks near {fb(est.deepspeed_peak_disk)})\n"
            f"  reads      {fb(est.read_bytes)}\n"
            f"  time       about {est.estimated_seconds:.0f} s"
        )
    return 0 if est.fits else EXIT_DOES_NOT_FIT


def checked_plan(args: argparse.Namespace) -> tuple[Any, Any]:
    """Scan, refuse a damaged source (unless --force), plan, and refuse an existing output before any work;
    shared by the rich and the JSON-lines faces of `convert --format universal`."""
    from inspector.convert.writers.universal import plan_universal, prepare
    from inspector.scan.scanner import scan

    ckpt = scan(args.path, args.tag)
    if ckpt.errors and not args.force:
        raise DamagedCheckpointError(
            f"{ckpt.tag_dir} has {len(ckpt.errors)} error finding(s); see `zero-inspector scan`.",
            hint="A universal checkpoint from a damaged source would resume wrong.",
        )
    plan = plan_universal(ckpt, os.path.abspath(args.out))
    prepare(plan, args.overwrite)
    return ckpt, plan
