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
    )


def add_convert_options(p: argparse.ArgumentParser) -> None:
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


# `--format KIND`: the five output kinds by name; `safetensors` (the old default) is `model`, and the older
# flags --weights-only/--adapter/--merge-adapter stay as aliases of the kind they name
KINDS = ("model", "weights", "adapter", "merged", "universal")
FORMAT_CHOICES = (*KINDS, "safetensors")
_KIND_FLAG = {"weights": "weights_only", "adapter": "adapter", "merged": "merge_adapter"}


def apply_format(args: argparse.Namespace) -> None:
    """Fold `--format KIND` and the alias flags into one choice (`args.format` is then `safetensors` or
    `universal`, the flags set as the kind says); two different kinds asked at once are an error."""
    chosen = {kind for kind, flag in _KIND_FLAG.items() if getattr(args, flag, False)}
    fmt = getattr(args, "format", None) or "model"
    kind = "model" if fmt == "safetensors" else fmt
    if kind in _KIND_FLAG:
        chosen.add(kind)
    if len(chosen) > 1 or (kind == "universal" and chosen):
        names = ", ".join(sorted(chosen | ({kind} - {"model"})))
        raise InspectorError(
            f"Asked for more than one output kind ({names}).",
            hint="Pick one: --format " + "|".join(KINDS) + ".",
            title="Invalid option",
        )
    for k, flag in _KIND_FLAG.items():
        setattr(args, flag, k in chosen)
    args.format = "universal" if kind == "universal" else "safetensors"
