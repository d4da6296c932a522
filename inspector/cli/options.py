"""The options `convert` and `export` share (selection, naming, dtype, shards, Hugging Face outputs) and
their parsing into ConvertOptions; the TUI's launcher reuses both."""

from __future__ import annotations

import argparse
from typing import Any

from inspector.errors import InspectorError


def options_from_args(args: argparse.Namespace) -> Any:
    """ConvertOptions from the parsed `add_convert_options` arguments; InspectorError for bad values."""
    from inspector.convert.options import ConvertOptions
    from inspector.system.units import parse_size

    try:
        shard = parse_size(args.shard_size)
    except ValueError as exc:
        raise InspectorError(
            str(exc), hint="Use sizes like 5GB, 500MB or 2GiB.", title="Invalid option"
        ) from None
    renames = []
    for r in args.rename or []:
        if "=" not in r:
            raise InspectorError(f"--rename {r!r} needs the form REGEX=REPLACEMENT.", title="Invalid option")
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


def workers_arg(text: str) -> int:
    """`--workers N`: a whole number from 1 to 1024 (memory does not grow with it; more than the budget
    holds at the smallest chunk simply wait their turn)."""
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if not 1 <= n <= 1024:
        raise argparse.ArgumentTypeError("give a number from 1 to 1024")
    return n


def add_workers_option(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--workers",
        type=workers_arg,
        metavar="N",
        help="threads reading and reducing or converting chunks at once (default: the usable cores); "
        "memory stays within the same budget whatever N",
    )


def add_convert_options(p: argparse.ArgumentParser) -> None:
    add_workers_option(p)
    p.add_argument(
        "--dtype",
        default="auto",
        help="output dtype for floating tensors: fp32, bf16, fp16, or "
        "auto (the training compute dtype; default). Integer buffers keep their dtype.",
    )
    p.add_argument("--shard-size", default="5GB", help="maximum shard size (default 5GB, HF naming)")
    p.add_argument(
        "--include",
        action="append",
        metavar="GLOB",
        help="only tensors matching a glob or module "
        "prefix (repeatable), e.g. 'model.layers.0' or '*.q_proj.*'",
    )
    p.add_argument(
        "--exclude", action="append", metavar="GLOB", help="leave out matching tensors (repeatable)"
    )
    p.add_argument(
        "--strip-prefix",
        action="append",
        metavar="PREFIX",
        help="remove a name prefix such as 'module.' or '_forward_module.' (repeatable)",
    )
    p.add_argument(
        "--rename",
        action="append",
        metavar="REGEX=REPL",
        help="regex rename applied after --strip-prefix (repeatable)",
    )
    p.add_argument(
        "--keep-fp32", action="append", metavar="GLOB", help="keep matching tensors in fp32, e.g. '*norm*'"
    )
    p.add_argument("--exclude-frozen", action="store_true", help="leave out frozen parameters")
    p.add_argument("--exclude-buffers", action="store_true", help="leave out buffers")
    p.add_argument(
        "--dedupe-tied",
        action="store_true",
        help="store tied weights once; the alias is recorded in the header metadata",
    )
    p.add_argument(
        "--source",
        choices=("masters", "module"),
        default="masters",
        help="where trainable weights are read from: the fp32 optimizer masters (default), or the 16-bit "
        "module copy in the model-states file (stage 1/2, output in the training dtype: half the bytes to "
        "read, no cast; equal to the cast masters in every DeepSpeed run the interop suite trains)",
    )
    hf = p.add_argument_group("Hugging Face outputs")
    hf.add_argument(
        "--weights-only",
        action="store_true",
        help="write only the safetensors files, not the config and tokenizer files of a Trainer checkpoint",
    )
    hf.add_argument(
        "--adapter",
        action="store_true",
        help="write the LoRA adapter in PEFT's layout (adapter_model.safetensors + adapter_config.json)",
    )
    hf.add_argument(
        "--merge-adapter",
        action="store_true",
        help="write a plain model folder with the LoRA adapter merged into the base weights",
    )
    hf.add_argument(
        "--base",
        metavar="DIR",
        help="base model folder for --merge-adapter (default: base_model_name_or_path in adapter_config.json)",
    )


# `--format KIND`: the output kinds by name (the registry's); `safetensors` (the old default) is `model`, and
# the older flags --weights-only/--adapter/--merge-adapter stay as aliases of the kind they name
FORMAT_ALIASES = {"safetensors": "model"}
_KIND_FLAG = {"weights": "weights_only", "adapter": "adapter", "merged": "merge_adapter"}


FORMAT_HELP = (
    "the output kind: model (the default: safetensors plus a Trainer checkpoint's config and tokenizer; "
    "`safetensors` is the same), weights (safetensors only), adapter (PEFT LoRA adapter), merged (the adapter "
    "merged into its base; --base names the base folder), universal (a DeepSpeed universal checkpoint in "
    "OUT/<tag>_uni plus OUT/latest_universal: resume on any world size with load_universal; OUT may be the "
    "checkpoint root)"
)


def apply_format(args: argparse.Namespace) -> str:
    """Fold `--format KIND` and the alias flags into one kind name (set as `args.format` and returned); two
    different kinds asked at once are an error, before anything is read or written."""
    from inspector.convert.kinds import DEFAULT, KINDS, get, names

    chosen = {kind for kind, flag in _KIND_FLAG.items() if getattr(args, flag, False)}
    fmt = getattr(args, "format", None) or DEFAULT
    kind = get(FORMAT_ALIASES.get(fmt, fmt)).name  # an unknown name: a clear error naming the kinds
    if kind != DEFAULT or not chosen:
        chosen.add(kind)
    if len(chosen) > 1:
        raise InspectorError(
            f"Asked for more than one output kind ({', '.join(sorted(chosen))}).",
            hint="Pick one: --format " + "|".join(names()) + ".",
            title="Invalid option",
        )
    args.format = chosen.pop()
    if getattr(args, "base", None) and not get(args.format).takes_base:
        takers = " or ".join(k.name for k in KINDS if k.takes_base)
        raise InspectorError(f"--base is only used with --format {takers}.", title="Invalid option")
    return str(args.format)


def request_from_args(args: argparse.Namespace, *, allow_damaged: bool = False) -> Any:
    """The kinds' Request from parsed `convert` / `preflight` arguments."""
    from inspector.convert.kinds import Request

    return Request(
        options=options_from_args(args), base=getattr(args, "base", None), allow_damaged=allow_damaged
    )
