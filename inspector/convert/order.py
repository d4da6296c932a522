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
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from inspector.convert.kinds.base import Job, Request
from inspector.convert.options import ConvertOptions
from inspector.errors import InspectorError, InvalidOptionError
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

    def plan(
        self, part: tuple[int, int] | None = None, out: str | None = None, *, ckpt: Checkpoint | None = None
    ) -> tuple[Checkpoint, Job]:
        """Scan, pick the kind, plan its job (a bucket OUT wrapped): the checkpoint and the job. `part` names
        an s3:// OUT's staging folder (default: this order's); `out`: plan for another OUT (preflight);
        `ckpt`: this order's checkpoint, already scanned (`scanned`), so a command scans it once."""
        from inspector.convert.bucket import plan_output
        from inspector.convert.kinds import get

        ckpt = self.scanned() if ckpt is None else ckpt  # a bad path fails here, before the converter loads
        job = plan_output(
            get(self.kind), ckpt, self.request, out or self.out, self.staging, part or self.part
        )
        return ckpt, job

    def scanned(self) -> Checkpoint:
        """The checkpoint this order names (its path, tag and --tp-split rules), scanned."""
        from inspector.scan.scanner import scan

        return scan(self.path, self.tag, tp_split=self.tp_split)


def to_json(order: Order) -> str:
    return json.dumps({"version": ORDER_VERSION, "order": asdict(order)})


MAX_ORDER_CHARS = 1 << 20  # what the child reads of stdin
MAX_ORDER_DEPTH = 8  # the order's own shape nests 5 deep (document, order, request, options, a rename pair)
MAX_ENTRIES = 4096  # globs, prefixes, renames, TP-split rules
MAX_WORKERS = 1024  # as --workers
MAX_PARTS = 100_000  # as --part I/N
_JSON_STRING = re.compile(r'"(?:[^"\\]|\\.)*"')


def from_json(text: str) -> Order:
    """The order a front end sent (`convert --order -`), read into the same typed records as the command
    line's options and put through the same checks (`check`): any value of another type, range or shape,
    an unknown field, or a document too large or too deep is refused with one clear error."""
    from inspector.errors import InputError
    from inspector.parse.tree import Node

    try:
        doc = Node(_bounded_json(text), "the conversion order")
        if doc.at("version").value != ORDER_VERSION or not doc.is_mapping():
            raise doc.at("version").fail(f"is not {ORDER_VERSION}")
        order = _order(doc.at("order"))
    except InputError as exc:
        raise _refused(f"{exc.field}: {exc.problem}") from None
    except ValueError as exc:
        raise _refused(str(exc)) from None
    return check(order)


def _refused(why: str) -> InvalidOptionError:
    return InvalidOptionError(
        f"The conversion order is not one this version reads ({why}).",
        hint="The app and the converter come from different versions; start the app again.",
    )


def _bounded_json(text: str) -> Any:
    """`text` parsed, after its size and its nesting (brackets outside strings) were bounded: the decoder
    recurses per level, and a crafted document 10⁵ levels deep must be a refusal, not a RecursionError."""
    if len(text) > MAX_ORDER_CHARS:
        raise ValueError(f"it is longer than {MAX_ORDER_CHARS:,} characters")
    depth = 0
    for c in re.sub(r"[^\[\]{}]", "", _JSON_STRING.sub("", text)):
        depth += 1 if c in "[{" else -1
        if depth > MAX_ORDER_DEPTH:
            raise ValueError(f"it nests deeper than {MAX_ORDER_DEPTH} levels")
    try:
        return json.loads(text, parse_constant=lambda name: float("nan"))  # NaN: refused as not a number
    except (ValueError, RecursionError):
        raise ValueError("it is not JSON") from None


def _fields(node: Any, cls: type) -> dict[str, Any]:
    """The mapping's entries, each named after a field of `cls` (an unknown field is refused, not ignored)."""
    known = {f.name for f in fields(cls)}
    out = dict(node.entries("field", names=False))
    for key in out:
        if key not in known:
            raise out[key].fail("is not a field of this version")
    return out


def _texts(node: Any) -> tuple[str, ...]:
    return tuple(n.text() for n in node.seq(MAX_ENTRIES))


def _pairs(node: Any) -> tuple[tuple[str, str], ...]:
    out = []
    for pair in node.seq(MAX_ENTRIES):
        items = pair.seq(2)
        if len(items) != 2:
            raise pair.fail("is not a pair")
        out.append((items[0].text(), items[1].text()))
    return tuple(out)


def _options(node: Any) -> ConvertOptions:
    f, d = _fields(node, ConvertOptions), ConvertOptions()
    texts = ("include", "exclude", "strip_prefix", "keep_fp32")
    flags = ("exclude_frozen", "exclude_buffers", "dedupe_tied")
    given: dict[str, Any] = {k: _texts(f[k]) for k in texts if k in f}
    given |= {k: f[k].flag() for k in flags if k in f}
    return ConvertOptions(
        dtype=f["dtype"].text(32) if "dtype" in f else d.dtype,
        shard_size=f["shard_size"].integer(1, 1 << 60) if "shard_size" in f else d.shard_size,
        renames=_pairs(f["renames"]) if "renames" in f else d.renames,
        chunk_elems=f["chunk_elems"].integer(1, 1 << 30) if "chunk_elems" in f else d.chunk_elems,
        source=f["source"].text(16) if "source" in f else d.source,
        workers=f["workers"].opt_integer(1, MAX_WORKERS) if "workers" in f else d.workers,
        **given,
    )


def _order(node: Any) -> Order:
    f = _fields(node, Order)
    r = _fields(f["request"], Request) if "request" in f else {}
    request = Request(
        options=_options(r["options"]) if "options" in r else ConvertOptions(),
        base=r["base"].text() if "base" in r and not r["base"].is_none() else None,
        **{k: r[k].flag() for k in ("side_files", "allow_damaged") if k in r},
    )
    part = None
    if "part" in f and not f["part"].is_none():
        items = f["part"].seq(2)
        if len(items) != 2:
            raise f["part"].fail("is not a pair I, N")
        part = (items[0].integer(0, MAX_PARTS), items[1].integer(1, MAX_PARTS))

    def text(key: str) -> str | None:
        return f[key].text() if key in f and not f[key].is_none() else None

    if "path" not in f or "out" not in f:
        raise node.fail("names no checkpoint or no output")
    return Order(
        path=f["path"].text(),
        out=f["out"].text(),
        kind=f["kind"].text(32) if "kind" in f else "model",
        tag=text("tag"),
        request=request,
        **{k: f[k].flag() for k in ("overwrite", "fsync") if k in f},
        staging=text("staging"),
        part=part,
        executor=f["executor"].text(16) if "executor" in f else "local",
        ray_address=text("ray_address"),
        parts=f["parts"].opt_integer(1, MAX_PARTS) if "parts" in f else None,
        tp_split=_pairs(f["tp_split"]) if "tp_split" in f else (),
    )


def check(order: Order) -> Order:
    """The rules an order obeys however it arrived (the command line's options or the app's JSON): a known
    kind and what it takes, workers and parts in range, one way to split the job, known choices."""
    from inspector.convert.kinds import get
    from inspector.convert.options import DTYPE_ALIASES, SOURCES
    from inspector.scan.tp_rules import parse_rule

    o = order.request.options

    def bad(what: str) -> InvalidOptionError:
        return InvalidOptionError(what)

    try:
        kind = get(order.kind)
    except InspectorError as exc:  # an unknown name: the error names the kinds
        raise InvalidOptionError(exc.message, hint=exc.hint) from None
    if order.request.base is not None and not kind.takes_base:
        raise bad(f"--base is not used with --format {order.kind}.")
    if o.workers is not None and not 1 <= o.workers <= MAX_WORKERS:
        raise bad(f"--workers {o.workers}: give a number from 1 to {MAX_WORKERS}.")
    if order.part is not None:
        check_part(*order.part, f"{order.part[0]}/{order.part[1]}")
    if order.parts is not None and order.parts < 1:
        raise bad(f"--parts {order.parts}: at least 1.")
    if order.executor not in ("local", "ray") or (order.executor == "ray" and order.part is not None):
        raise bad(f"--executor {order.executor!r}: local, or ray without --part.")
    if o.source not in SOURCES:
        raise bad(f"--source {o.source!r}: one of {', '.join(SOURCES)}.")
    if o.dtype != "auto" and o.dtype.lower() not in DTYPE_ALIASES:
        raise InvalidOptionError(
            f"Unknown output dtype {o.dtype!r}.", hint="Use fp32, bf16, fp16 or auto."
        )
    if o.shard_size < 1:
        raise bad(f"--shard-size {o.shard_size}: at least one byte.")
    if any("=" in pat for pat, _ in o.renames):
        raise bad("A --rename pattern holds `=`, which REGEX=REPLACEMENT cannot carry.")
    for glob, rule in order.tp_split:
        try:
            same = parse_rule(f"{glob}={rule}") == (glob, rule)
        except ValueError as exc:
            raise bad(f"--tp-split: {exc}.") from None
        if not same:
            raise bad(f"--tp-split {glob!r}={rule!r} does not read back as one rule.")
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
    if not (sep and digits.fullmatch(i) and digits.fullmatch(n)):
        check_part(-1, 0, text)
    return check_part(int(i), int(n), text)


def check_part(i: int, n: int, text: str) -> tuple[int, int]:
    """Part I of N, as `--part` and the app's order both give it: 0 <= I < N <= 100,000."""
    if not 0 <= i < n <= MAX_PARTS:
        raise InvalidOptionError(
            f"--part {text!r} is not I/N with 0 <= I < N.",
            hint="For example --part $SLURM_ARRAY_TASK_ID/8 in a Slurm array of 8 tasks numbered from 0.",
        )
    return i, n


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
    request = Request(
        options=options_from_args(args),
        base=getattr(args, "base", None),
        allow_damaged=bool(getattr(args, "force", False)),
    )
    return check(
        Order(
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
    )
