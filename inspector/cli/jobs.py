"""From parsed `convert` / `preflight` / `verify` arguments to the kind and its job: shared by the rich face
(cli/convert.py) and the JSON-lines face (cli/progress.py)."""

from __future__ import annotations

import argparse
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from inspector.convert.order import Order, from_args
from inspector.errors import InvalidOptionError

if TYPE_CHECKING:
    from inspector.scan.model import Checkpoint


def plan_job(
    args: argparse.Namespace, *, allow_damaged: bool, out: str | None = None, ckpt: Checkpoint | None = None
) -> tuple[Checkpoint, Any, Order]:
    """The order the arguments describe, planned: the checkpoint, the kind's job (OUT may be s3://), and the
    order (`allow_damaged`: preflight predicts for a damaged checkpoint too; convert takes --force). `ckpt`:
    the checkpoint the command has already scanned (preflight's), so it is not scanned again."""
    order = from_args(args, out=out)
    if allow_damaged and not order.request.allow_damaged:
        order = replace(order, request=replace(order.request, allow_damaged=True))
    return planned(order, getattr(args, "selection", None), ckpt)


def planned(
    order: Order, selection: str | None, ckpt: Checkpoint | None = None
) -> tuple[Checkpoint, Any, Order]:
    """The order planned on one scan of its checkpoint (`ckpt` when the caller has it): `--selection NAME`
    narrows the order to that named selection's tensors in that same scan (`selection_store.narrowed`: the
    app's picker resolves names the same way), and the plan reads it too."""
    ckpt = order.scanned() if ckpt is None else ckpt
    if selection:
        from inspector.convert.selection_store import narrowed

        order = narrowed(order, selection, ckpt)
    ckpt, job = order.plan(ckpt=ckpt)
    return ckpt, job, order


def planned_order(args: argparse.Namespace) -> tuple[Checkpoint, Any, Order]:
    """The order to carry out, planned: the one a front end sent on stdin (`--order -`: the app's own plan,
    so the child converts exactly what it previewed), else the one the arguments describe."""
    import sys

    from inspector.convert.order import from_json

    if getattr(args, "order", None) != "-":
        return planned(from_args(args), getattr(args, "selection", None))
    order = from_json(sys.stdin.read(1 << 20))
    if (order.path, order.out) != (args.path, args.out):  # the command line shown in `ps` tells the truth
        raise InvalidOptionError(
            "The conversion order names another checkpoint or output than the command line.",
        )
    return planned(order, None)


def verify_job(args: argparse.Namespace) -> tuple[Any, Any, str]:
    """The kind of the output in OUT, the checkpoint scanned at the tag the output records (or --tag), OUT."""
    from inspector.convert.kinds import of_output
    from inspector.errors import InspectorError, NoSuchTagError
    from inspector.remote.roots import absolute
    from inspector.scan.scanner import scan

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


def verify_options(kind: Any, args: argparse.Namespace) -> dict[str, Any]:
    """The keyword arguments of `kind.verify` beyond the checkpoint and output: `--against`, and `--base` for
    the kinds that read a base model (refused for the others rather than ignored)."""
    from inspector.errors import InspectorError

    options: dict[str, Any] = {"against": args.against}
    base = getattr(args, "base", None)
    if base and not kind.takes_base:
        raise InspectorError(
            f"--base is only used to verify a merged model; {args.out} holds a {kind.name} output.",
            hint="Leave out --base.",
            title="Invalid option",
        )
    if base:
        options["base"] = base
    return options


def byte_sources(*roots: str) -> list[str]:
    """One line per root `verify` read: where from, and what proved the bytes it trusted."""
    from inspector.remote.backend import provenance

    return [f"Bytes {provenance(root)}." for root in roots]


def job_events(order: Order, job: Any, tasks: list[Any]) -> Any:
    """The run's events, from this process or (`--executor ray`) from Ray tasks and the finish here: the same
    Progress and Report types either way, so both faces drive them alike. `tasks` collects each Ray part's
    result as it ends."""
    if order.executor != "ray":
        return job.run(overwrite=order.overwrite, fsync=order.fsync, part=order.part)
    from inspector.convert.ray_executor import run_on_ray

    return run_on_ray(order, parts=order.parts, address=order.ray_address, on_part=tasks.append, job=job)


def ray_options(args: argparse.Namespace) -> None:
    """What --executor ray cannot be combined with, refused before anything is read."""

    if getattr(args, "executor", "local") != "ray":
        return
    if args.part is not None:
        raise InvalidOptionError(
            "--part and --executor ray both split the job: use one.",
            hint="--executor ray runs every part as a task on the cluster; --part I/N is for schedulers "
            "without Ray (Slurm arrays, Kubernetes indexed jobs).",
        )
    if args.parts is not None and args.parts < 1:
        raise InvalidOptionError(f"--parts {args.parts}: at least 1.")
