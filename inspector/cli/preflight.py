"""`preflight`: what a conversion would need (peak RAM, disk, time) before it runs, in the one shape every
output kind answers in (`preflight --json`); a damaged checkpoint gets its findings, never a prediction."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from inspector.cli.console import print_json
from inspector.cli.options import add_convert_options, format_help
from inspector.cli.parser import add_command


def register(sub: Any, add_common: Callable[[argparse.ArgumentParser], None]) -> None:
    """`preflight`, with the common path/tag options."""
    add_command(
        sub,
        "preflight",
        "predict peak RAM, disk and time of a conversion before running it",
        lambda p: _preflight_options(p, add_common),
    )


def preflight_json(job: Any, verdict: Any) -> dict[str, Any]:
    """`preflight --json`: the one shape every kind answers in, plus what the kind adds."""
    from inspector.convert.preflight import assessment_json

    return {
        **assessment_json(verdict),
        "output_kind": job.kind,
        "format": job.kind,
        "tensors": job.tensor_count,
        "files": [f.name for f in job.files],
        **job.preflight_json(),
    }


def cmd_preflight(args: argparse.Namespace) -> int:
    from inspector.cli.console import console as _console
    from inspector.cli.jobs import plan_job
    from inspector.cli.render import print_assessment
    from inspector.errors import EXIT_DOES_NOT_FIT
    from inspector.scan.scanner import scan

    ckpt = scan(args.path, args.tag, tp_split=tuple(getattr(args, "tp_split", ())))
    if ckpt.errors:  # a prediction for a damaged checkpoint would describe a conversion that must not run
        _refuse_damaged(ckpt, args.json)
    budget = _chosen_ram(args.ram) if args.ram else None
    from inspector.system.disk import proposed_out  # the app's Export form proposes the same folder

    out = args.out or proposed_out(ckpt.root, ckpt.tag)
    _, job, _ = plan_job(args, allow_damaged=True, out=out, ckpt=ckpt)  # the scan above, not a second one
    verdict = job.assess(budget)
    if args.json:
        print_json(preflight_json(job, verdict))
    else:
        print_assessment(_console(), verdict, job)
    return 0 if verdict.fits else EXIT_DOES_NOT_FIT


def _chosen_ram(text: str) -> Any:
    """`--ram 16GB`: the memory budget of the node asked about, read as --shard-size is."""
    from inspector.errors import InspectorError
    from inspector.system.budget import chosen_budget
    from inspector.system.units import parse_size

    try:
        nbytes = parse_size(text)
        if nbytes <= 0:
            raise ValueError("the RAM must be positive")
    except ValueError as exc:
        raise InspectorError(str(exc), hint="Use sizes like 16GB or 64GiB.", title="Invalid option") from None
    return chosen_budget(nbytes, text)


def _refuse_damaged(ckpt: Any, as_json: bool) -> None:
    """Show the error findings as `scan` does (stdout), then refuse with exit 1."""
    from inspector.errors import DamagedCheckpointError
    from inspector.system.units import plural

    errors = ckpt.errors
    if as_json:  # the one JSON object of this run: main() prints no second one for the error below
        print_json(
            {
                "fits": False,
                "damaged": True,
                "findings": [f.as_dict() for f in errors],
                "error": {"title": "Damaged checkpoint", "message": f"{plural(len(errors), 'error finding')}"},
            }
        )
    else:
        from rich.panel import Panel

        from inspector.cli.console import console as _console
        from inspector.cli.render import findings

        _console().print(
            Panel(findings(tuple(errors)), title="Findings", title_align="left", border_style="red")
        )
    refusal = DamagedCheckpointError(
        f"The checkpoint has {plural(len(errors), 'error finding')}; no prediction is made for a damaged checkpoint.",
        hint="Run `zero-inspector scan` for details; converting it would write wrong weights.",
    )
    refusal.json_printed = as_json  # type: ignore[attr-defined]
    raise refusal


def _preflight_options(
    p: argparse.ArgumentParser, add_common: Callable[[argparse.ArgumentParser], None]
) -> None:
    add_common(p)
    p.add_argument(
        "--out",
        help="where the output would go, a folder or s3://bucket/prefix (for free disk; default: "
        "NAME-TAG-safetensors beside the checkpoint, or in your home folder when that one is not writable)",
    )
    p.add_argument("--staging", metavar="DIR", help="as for convert: the staging folder of an s3:// output")
    from inspector.convert.kinds import DEFAULT

    p.add_argument("--format", metavar="KIND", default=DEFAULT, help=format_help() + "; as for convert")
    add_convert_options(p)
    p.add_argument(
        "--ram", metavar="SIZE", help="judge against a node with this much RAM (e.g. 16GB) instead of this machine"
    )
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=cmd_preflight)
