"""From parsed `convert` / `preflight` / `verify` arguments to the kind and its job: shared by the rich face
(cli/convert.py) and the JSON-lines face (cli/progress.py)."""

from __future__ import annotations

import argparse
import re
from typing import Any

from inspector.cli.options import apply_format, request_from_args


def plan_job(args: argparse.Namespace, *, allow_damaged: bool, out: str | None = None) -> tuple[Any, Any]:
    """Scan, pick the kind `--format` names, plan its job: shared by the rich and JSON-lines faces."""
    from inspector.convert.bucket import plan_output
    from inspector.convert.kinds import get
    from inspector.scan.scanner import scan

    split = tuple(getattr(args, "tp_split", ()))  # a tensor-parallel split the checkpoint does not record
    ckpt = scan(args.path, args.tag, tp_split=split)  # a bad path fails here, before the converter loads
    kind = get(apply_format(args))
    request = request_from_args(args, allow_damaged=allow_damaged)
    part = parse_part(getattr(args, "part", None))  # names an s3:// OUT's staging folder
    job = plan_output(kind, ckpt, request, out or args.out, getattr(args, "staging", None), part)  # OUT may be s3://
    return ckpt, job


def parse_part(text: str | None) -> tuple[int, int] | None:
    """`--part I/N`: part I (0 <= I < N, as SLURM_ARRAY_TASK_ID and JOB_COMPLETION_INDEX count) of N."""
    if text is None:
        return None
    i, sep, n = text.partition("/")
    digits = re.compile(r"[0-9]{1,6}")  # ASCII only: str.isdigit() takes `²`, which int() then refuses
    if not (sep and digits.fullmatch(i) and digits.fullmatch(n) and 0 <= int(i) < int(n) <= 100_000):
        from inspector.errors import InspectorError

        raise InspectorError(
            f"--part {text!r} is not I/N with 0 <= I < N.",
            hint="For example --part $SLURM_ARRAY_TASK_ID/8 in a Slurm array of 8 tasks numbered from 0.",
            title="Invalid option",
        )
    return int(i), int(n)


def verify_job(args: argparse.Namespace) -> tuple[Any, Any, str]:
    """The kind of the output in OUT, the checkpoint scanned at the tag the output records (or --tag), OUT."""
    from inspector.convert.kinds import of_output
    from inspector.errors import InspectorError, NoSuchTagError
    from inspector.scan.scanner import scan
    from inspector.system.bytesource import absolute

    out = absolute(args.out)  # a folder, or an s3:// prefix read through the object-store source
    kind = of_output(out)
    split = tuple(getattr(args, "tp_split", ()))
    recorded = None if args.tag else kind.recorded_tag(out)
    try:
        return kind, scan(args.path, args.tag or recorded, tp_split=split), out
    except NoSuchTagError:
        if not recorded:
            raise
        raise InspectorError(  # the output names a tag this checkpoint lacks: it is another checkpoint's
            f"{out} was converted from a checkpoint's tag {recorded}, which {args.path} does not have: this "
            "output came from another checkpoint.",
            hint="Verify it against the checkpoint it was converted from, or pass --tag to compare it with "
            "a tag of this one anyway.",
            title="Output of another checkpoint",
        ) from None


def byte_sources(*roots: str) -> list[str]:
    """One line per root `verify` read: where from, and what proved the bytes it trusted."""
    from inspector.remote.backend import provenance

    return [f"Bytes {provenance(root)}." for root in roots]


def job_events(args: argparse.Namespace, job: Any, part: tuple[int, int] | None, tasks: list[Any]) -> Any:
    """The run's events, from this process or (`--executor ray`) from Ray tasks and the finish here: the same
    Progress and Report types either way, so both faces drive them alike. `tasks` collects each Ray part's
    result as it ends."""
    if getattr(args, "executor", "local") != "ray":
        return job.run(overwrite=args.overwrite, fsync=args.fsync, part=part)
    from inspector.convert.ray_executor import JobSpec, run_on_ray

    spec = JobSpec(
        args.path,
        args.tag,
        args.format,
        request_from_args(args, allow_damaged=args.force),
        args.out,
        args.overwrite,
        args.fsync,
        getattr(args, "staging", None),
    )
    return run_on_ray(spec, parts=args.parts, address=args.ray_address, on_part=tasks.append, job=job)


def ray_options(args: argparse.Namespace) -> None:
    """What --executor ray cannot be combined with, refused before anything is read."""
    from inspector.errors import InspectorError

    if getattr(args, "executor", "local") != "ray":
        return
    if args.part is not None:
        raise InspectorError(
            "--part and --executor ray both split the job: use one.",
            hint="--executor ray runs every part as a task on the cluster; --part I/N is for schedulers "
            "without Ray (Slurm arrays, Kubernetes indexed jobs).",
            title="Invalid option",
        )
    if args.parts is not None and args.parts < 1:
        raise InspectorError(f"--parts {args.parts}: at least 1.", title="Invalid option")
