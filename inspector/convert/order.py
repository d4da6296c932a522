"""One conversion as frozen data: what to read, which kind, what was asked, where it goes and how it runs.

An `Order` is what a front end hands over: the CLI builds one from its arguments (`from_args`), the app sends
its own to the conversion child as versioned JSON (`to_json` / `from_json`), so the child plans exactly the job
the app previewed, and a Ray task plans its part from it. `to_argv` writes the `convert` command that does the
same (the app shows it; `from_args(parse(to_argv(o))) == o` is a property test).
"""

from __future__ import annotations

import argparse
import json
import re
from dataclasses import asdict, dataclass, field
from typing import Any

from inspector.convert.kinds.base import Job, Request
from inspector.convert.options import ConvertOptions
from inspector.errors import InvalidOptionError
from inspector.scan.model import Checkpoint

ORDER_VERSION = 1
# `--format KIND`: `safetensors` (the old default) is `model`; the older flags name the kind they stand for
FORMAT_ALIASES = {"safetensors": "model"}
KIND_FLAGS = {"weights": "weights_only", "adapter": "adapter", "merged": "merge_adapter"}


@dataclass(frozen=True)
class Order:
    """A conversion, as the user asked it (planned by `plan`)."""

    path: str
    out: str
    kind: str = "model"
    tag: str | None = None
    request: Request = field(default_factory=Request)
    overwrite: bool = False
    fsync: bool = False
    staging: str | None = None  # an s3:// OUT's staging folder (default: the temporary folder)
    part: tuple[int, int] | None = None
    executor: str = "local"
    ray_address: str | None = None
    parts: int | None = None  # --executor ray: how many tasks
    tp_split: tuple[tuple[str, str], ...] = ()  # --tp-split: how an unrecorded tensor-parallel split joins

    def plan(self, part: tuple[int, int] | None = None, out: str | None = None) -> tuple[Checkpoint, Job]:
        """Scan, pick the kind, plan its job (a bucket OUT wrapped): the checkpoint and the job. `part` names
        an s3:// OUT's staging folder (default: this order's); `out`: plan for another OUT (preflight)."""
        from inspector.convert.bucket import plan_output
        from inspector.convert.kinds import get
        from inspector.scan.scanner import scan

        ckpt = scan(self.path, self.tag, tp_split=self.tp_split)  # a bad path fails here, before the converter loads
        job = plan_output(
            get(self.kind), ckpt, self.request, out or self.out, self.staging, part or self.part
        )
        return ckpt, job


def to_json(order: Order) -> str:
    return json.dumps({"version": ORDER_VERSION, "order": asdict(order)})


def from_json(text: str) -> Order:
    """The order a front end sent; a document of another version or shape is refused, not guessed at."""
    try:
        doc = json.loads(text)
        if not isinstance(doc, dict) or doc.get("version") != ORDER_VERSION:
            raise ValueError(f"version {doc.get('version') if isinstance(doc, dict) else None!r}")
        raw = dict(doc["order"])
        req = dict(raw.pop("request"))
        opts: dict[str, Any] = {
            k: tuple(v) if isinstance(v, list) else v for k, v in dict(req.pop("options")).items()
        }
        opts["renames"] = tuple(tuple(r) for r in opts.get("renames", ()))
        part = raw.pop("part", None)
        raw["tp_split"] = tuple(tuple(pair) for pair in raw.get("tp_split", ()))
        order = Order(
            **raw,
            request=Request(options=ConvertOptions(**opts), **req),
            part=tuple(part) if part is not None else None,  # type: ignore[arg-type]
        )
    except (ValueError, TypeError, KeyError) as exc:
        raise InvalidOptionError(
            f"The conversion order is not one this version reads ({exc}).",
            hint="The app and the converter come from different versions; start the app again.",
        ) from None
    return order


def to_argv(order: Order) -> list[str]:
    """The `convert` command line that carries out `order` (every option that differs from its default)."""
    o, r = order.request.options, order.request
    args = ["convert", order.path, order.out, "--format", order.kind]
    d = ConvertOptions()
    args += ["--tag", order.tag] if order.tag is not None else []
    args += ["--dtype", o.dtype] if o.dtype != d.dtype else []
    args += ["--shard-size", str(o.shard_size)] if o.shard_size != d.shard_size else []
    args += ["--source", o.source] if o.source != d.source else []
    for flag, values in (
        ("--include", o.include),
        ("--exclude", o.exclude),
        ("--strip-prefix", o.strip_prefix),
        ("--keep-fp32", o.keep_fp32),
    ):
        args += [f"{flag}={v}" for v in values]
    args += [f"--rename={pat}={repl}" for pat, repl in o.renames]
    args += [f"--tp-split={glob}={rule}" for glob, rule in order.tp_split]
    for flag, on in (
        ("--exclude-frozen", o.exclude_frozen),
        ("--exclude-buffers", o.exclude_buffers),
        ("--dedupe-tied", o.dedupe_tied),
        ("--overwrite", order.overwrite),
        ("--fsync", order.fsync),
        ("--force", r.allow_damaged),
    ):
        args += [flag] if on else []
    for flag, value in (
        ("--base", r.base),
        ("--workers", o.workers),
        ("--staging", order.staging),
        ("--part", f"{order.part[0]}/{order.part[1]}" if order.part else None),
        ("--ray-address", order.ray_address),
        ("--parts", order.parts),
    ):
        args += [flag, str(value)] if value is not None else []
    args += ["--executor", order.executor] if order.executor != "local" else []
    return args


def parse_part(text: str | None) -> tuple[int, int] | None:
    """`--part I/N`: part I (0 <= I < N, as SLURM_ARRAY_TASK_ID and JOB_COMPLETION_INDEX count) of N."""
    if text is None:
        return None
    i, sep, n = text.partition("/")
    digits = re.compile(r"[0-9]{1,6}")  # ASCII only: str.isdigit() takes `²`, which int() then refuses
    if not (sep and digits.fullmatch(i) and digits.fullmatch(n) and 0 <= int(i) < int(n) <= 100_000):
        raise InvalidOptionError(
            f"--part {text!r} is not I/N with 0 <= I < N.",
            hint="For example --part $SLURM_ARRAY_TASK_ID/8 in a Slurm array of 8 tasks numbered from 0.",
        )
    return int(i), int(n)


def options_from_args(args: argparse.Namespace) -> ConvertOptions:
    """ConvertOptions from the parsed convert options; InspectorError for bad values."""
    from inspector.system.units import parse_size

    try:
        shard = parse_size(str(args.shard_size))
    except ValueError as exc:
        raise InvalidOptionError(
            str(exc), hint="Use sizes like 5GB, 500MB or 2GiB."
        ) from None
    renames = []
    for r in args.rename or []:
        if "=" not in r:
            raise InvalidOptionError(f"--rename {r!r} needs the form REGEX=REPLACEMENT.")
        pat, _, repl = r.partition("=")
        renames.append((pat, repl))
    return ConvertOptions(
        dtype=args.dtype,
        shard_size=shard,
        include=tuple(args.include or ()),
        exclude=tuple(args.exclude or ()),
        strip_prefix=tuple(args.strip_prefix or ()),
        renames=tuple(renames),
        keep_fp32=tuple(args.keep_fp32 or ()),
        exclude_frozen=args.exclude_frozen,
        exclude_buffers=args.exclude_buffers,
        dedupe_tied=args.dedupe_tied,
        source=args.source,
        workers=getattr(args, "workers", None),
    )


def kind_from_args(args: argparse.Namespace) -> str:
    """`--format KIND` and the alias flags folded into one kind name; two different kinds asked at once, or
    --base for a kind that reads no base, are an error before anything is read or written."""
    from inspector.convert.kinds import DEFAULT, KINDS, get, names

    chosen = {kind for kind, flag in KIND_FLAGS.items() if getattr(args, flag, False)}
    fmt = getattr(args, "format", None) or DEFAULT
    kind = get(FORMAT_ALIASES.get(fmt, fmt)).name  # an unknown name: a clear error naming the kinds
    if kind != DEFAULT or not chosen:
        chosen.add(kind)
    if len(chosen) > 1:
        raise InvalidOptionError(
            f"Asked for more than one output kind ({', '.join(sorted(chosen))}).",
            hint="Pick one: --format " + "|".join(names()) + ".",
        )
    name = chosen.pop()
    if getattr(args, "base", None) and not get(name).takes_base:
        takers = " or ".join(k.name for k in KINDS if k.takes_base)
        raise InvalidOptionError(f"--base is only used with --format {takers}.")
    return name


def from_args(args: argparse.Namespace, *, out: str | None = None) -> Order:
    """The order the parsed `convert` (or `preflight`) arguments describe."""
    workers = getattr(args, "workers", None)
    if workers is not None and workers < 1:
        raise InvalidOptionError(f"--workers {workers}: at least 1.")
    request = Request(
        options=options_from_args(args),
        base=getattr(args, "base", None),
        allow_damaged=bool(getattr(args, "force", False)),
    )
    return Order(
        path=args.path,
        out=out if out is not None else args.out,
        kind=kind_from_args(args),
        tag=args.tag,
        request=request,
        overwrite=bool(getattr(args, "overwrite", False)),
        fsync=bool(getattr(args, "fsync", False)),
        staging=getattr(args, "staging", None),
        part=parse_part(getattr(args, "part", None)),
        executor=getattr(args, "executor", "local") or "local",
        ray_address=getattr(args, "ray_address", None),
        parts=getattr(args, "parts", None),
        tp_split=tuple(getattr(args, "tp_split", ())),
    )
