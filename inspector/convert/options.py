"""What the user chose, and what it means for each tensor: pure, no I/O, no byte layout.

Options select source tensors (globs or module prefixes), rename them (prefix stripping, then regexes),
pick each one's output dtype (`--dtype`, `--keep-fp32`, integers kept) and fold tied aliases away. The
result is a list of (source tensor, output name, output dtype) that `plan` lays out into shards and headers.
Kept apart from `plan` because the faces use this part on its own, with no layout: the TUI checks the
options it derives from a tree selection with `select`, resolves `auto` with `resolve_dtype` and accepts
dtype names found in `DTYPE_ALIASES`.
"""

from __future__ import annotations

import fnmatch
import re
from dataclasses import dataclass, field

from inspector.errors import DamagedCheckpointError, InspectorError
from inspector.format.dtypes import OUTPUT_ALIASES
from inspector.parse.names import name_problem
from inspector.scan.model import Checkpoint, Kind, TensorInfo
from inspector.text import quoted

DTYPE_ALIASES = OUTPUT_ALIASES
CHUNK_ELEMS = 1 << 21  # 2 Mi elements: 8 MiB of fp32 per buffer; large enough that syscalls are noise,
# small enough that the whole pool (3 source + 3 output buffers, 36 MiB) keeps the process under 128 MiB
SOURCES = ("masters", "module")


@dataclass(frozen=True)
class ConvertOptions:
    """What the user chose. Globs match source names; renames apply after prefix stripping."""

    dtype: str = "auto"  # auto = the checkpoint's compute dtype
    shard_size: int = 5_000_000_000
    include: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()
    strip_prefix: tuple[str, ...] = ()
    renames: tuple[tuple[str, str], ...] = ()
    keep_fp32: tuple[str, ...] = ()
    exclude_frozen: bool = False
    exclude_buffers: bool = False
    dedupe_tied: bool = False
    chunk_elems: int = CHUNK_ELEMS
    source: str = "masters"  # "masters" (fp32) or "module" (the 16-bit module copy, where it fits)
    # threads reading, casting and writing chunks at once (None: the usable cores); not in the repr, which
    # the job's fingerprint hashes: the worker count changes no output byte
    workers: int | None = field(default=None, repr=False)


def resolve_dtype(name: str, ckpt: Checkpoint) -> str:
    if name == "auto":
        return ckpt.compute_dtype if ckpt.compute_dtype in ("bfloat16", "float16") else "float32"
    try:
        return DTYPE_ALIASES[name.lower()]
    except KeyError:
        raise InspectorError(
            f"Unknown output dtype {name!r}.", hint="Use fp32, bf16, fp16 or auto.", title="Invalid option"
        ) from None


def _matches(name: str, patterns: tuple[str, ...]) -> bool:
    """A glob (`*.norm.*`) or a module prefix (`model.layers.0` selects the whole submodule)."""
    return any(
        fnmatch.fnmatchcase(name, p) or name == p or name.startswith(p.rstrip(".") + ".") for p in patterns
    )


def rename(name: str, opts: ConvertOptions) -> str:
    for prefix in opts.strip_prefix:
        if name.startswith(prefix):
            name = name[len(prefix) :]
            break
    for pattern, repl in opts.renames:
        try:
            name = re.sub(pattern, repl, name)
        except re.error as exc:
            raise InspectorError(
                f"Bad --rename pattern {pattern!r}: {exc}.", title="Invalid option"
            ) from None
    return name


def select(ckpt: Checkpoint, opts: ConvertOptions) -> list[TensorInfo]:
    """Tensors to write, in checkpoint order. Aliases of unselected owners still count (they hold data)."""
    out = []
    for t in ckpt.tensors:
        if opts.include and not _matches(t.name, opts.include):
            continue
        if opts.exclude and _matches(t.name, opts.exclude):
            continue
        if opts.exclude_frozen and t.kind is Kind.FROZEN:
            continue
        if opts.exclude_buffers and t.kind is Kind.BUFFER:
            continue
        out.append(t)
    return out


Named = tuple[TensorInfo, str, str]  # (source tensor, output name, output dtype)


def check_inputs(ckpt: Checkpoint, opts: ConvertOptions, allow_damaged: bool) -> tuple[str, list[TensorInfo]]:
    """Reject choices that cannot work; return the output dtype and the selected tensors."""
    if ckpt.errors and not allow_damaged:
        raise DamagedCheckpointError(
            f"The checkpoint has {len(ckpt.errors)} error finding(s), e.g.: {ckpt.errors[0].message}",
            hint="Run `zero-inspector scan` to see them all. Converting a damaged checkpoint would write "
            "wrong weights.",
        )
    if opts.shard_size <= 0:
        raise InspectorError("--shard-size must be positive.", title="Invalid option")
    out_dtype = resolve_dtype(opts.dtype, ckpt)
    if opts.source not in SOURCES:
        raise InspectorError(
            f"Unknown source {opts.source!r}.", hint="Use masters or module.", title="Invalid option"
        )
    chosen = select(ckpt, opts)
    if not chosen:
        raise _empty(ckpt, opts)
    return out_dtype, chosen


def _empty(ckpt: Checkpoint, opts: ConvertOptions) -> InspectorError:
    """Why nothing would be written: the flags the user passed, or (none passed) the scan's own findings, so
    a forced conversion never blames options nobody gave."""
    flags = [
        f
        for f, on in (
            ("--include", opts.include),
            ("--exclude", opts.exclude),
            ("--exclude-frozen", opts.exclude_frozen),
            ("--exclude-buffers", opts.exclude_buffers),
        )
        if on
    ]
    if flags:
        return InspectorError(
            "No tensors match the selection.",
            hint=f"Check {'/'.join(flags)} against the names `zero-inspector scan --tensors` lists.",
            title="Empty selection",
        )
    found = f" ({len(ckpt.errors)} error finding(s), e.g.: {ckpt.errors[0].message})" if ckpt.errors else ""
    return InspectorError(
        f"The scan found no tensor it can write in this checkpoint{found}.",
        hint="Run `zero-inspector scan` to see what it recognised and why nothing could be read.",
        title="Nothing to convert",
    )


def name_tensors(
    chosen: list[TensorInfo], opts: ConvertOptions, out_dtype: str
) -> tuple[list[Named], dict[str, str], dict[str, str]]:
    """Output name and dtype of each chosen tensor; deduped tied aliases go to `aliases` (output name ->
    the name it aliases) and `alias_sources` (output name -> its source name) instead."""
    chosen_names = {t.name for t in chosen}
    aliases: dict[str, str] = {}
    alias_sources: dict[str, str] = {}  # deduped alias output name -> its source name
    planned: list[Named] = []
    seen: dict[str, str] = {}
    for t in chosen:
        name = rename(t.name, opts)
        problem = name_problem(name)
        if problem:  # the same rule names from a file pass: `__metadata__` would make the file unloadable
            raise InspectorError(
                f"Renaming {t.name} gives the output name {quoted(name)}, which {problem}.",
                hint="Adjust --strip-prefix/--rename so every output name is a plain tensor name.",
                title="Invalid option",
            )
        if name in seen:
            raise InspectorError(
                f"Two tensors would both be written as {name!r}: {seen[name]} and {t.name}.",
                hint="Adjust --strip-prefix/--rename so output names stay unique.",
                title="Name collision",
            )
        seen[name] = t.name
        if opts.dedupe_tied and t.kind is Kind.TIED and t.alias_of in chosen_names:
            aliases[name] = rename(t.alias_of, opts)
            alias_sources[name] = t.name
            continue
        if t.is_floating:
            dtype = "float32" if _matches(t.name, opts.keep_fp32) else out_dtype
        else:
            dtype = t.dtype
        planned.append((t, name, dtype))
    return planned, aliases, alias_sources
