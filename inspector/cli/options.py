"""The options `convert`, `preflight` and `open` share (selection, naming, dtype, shards, Hugging Face
outputs); `convert.order.from_args` turns the parsed arguments into the one Order, `to_argv` back."""

from __future__ import annotations

import argparse

# `limits.LOCAL_THREADS` and `limits.ZIP_THREADS`, said in the help without importing limits into every
# command's start-up (~18 ms): a test holds them equal
LOCAL_THREADS_SAID = 4
ZIP_THREADS_SAID = 8


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


def add_workers_option(p: argparse.ArgumentParser, exports: bool = False) -> None:
    """`--workers`; `exports`: the command may write a universal export, whose default has its own ceiling."""
    universal = f"; {ZIP_THREADS_SAID} for a universal export" if exports else ""
    p.add_argument(
        "--workers",
        type=workers_arg,
        metavar="N",
        help="threads reading and reducing or converting chunks at once (default: the usable cores; asked or "
        f"not, at most {LOCAL_THREADS_SAID} on local files, where more threads only wait on each other's "
        f"turn at Python's GIL{universal}); memory stays within the same budget whatever N",
    )


def add_tp_split_option(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--tp-split",
        metavar="PATTERN=DIM",
        action="append",
        type=_tp_split,
        default=[],
        help="for a tensor-parallel checkpoint that does not record how its parameters were split: how the "
        "shards of parameters matching the glob PATTERN join (0: stacked on dim 0, 1: side by side on dim 1, "
        "replicated: one copy); repeatable, first match wins, every parameter must match one",
    )


def _tp_split(text: str) -> tuple[str, str]:
    from inspector.scan.tp_rules import parse_rule  # the app's export form reads its rules with it too

    try:
        return parse_rule(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_convert_options(p: argparse.ArgumentParser) -> None:
    add_workers_option(p, exports=True)
    p.add_argument(
        "--dtype",
        default="auto",
        help="output dtype for floating tensors: fp32, bf16, fp16, or "
        "auto (the training compute dtype; default). Integer buffers keep their dtype.",
    )
    p.add_argument("--shard-size", default="5GB", help="maximum shard size (default 5GB, HF naming)")
    _add_selection_options(p)
    p.add_argument(
        "--source",
        choices=("masters", "module"),
        default="masters",
        help="where trainable weights are read from: the fp32 optimizer masters (default), or the 16-bit "
        "module copy in the model-states file (stage 1/2, output in the training dtype: half the bytes to "
        "read, no cast; equal to the cast masters in every DeepSpeed run the interop suite trains)",
    )
    _add_hf_options(p)


def add_filter_options(p: argparse.ArgumentParser) -> None:
    """Which tensors a command works on (`--include`, `--exclude`): the same words for convert and health,
    both read by `convert.options.select`."""
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


def _add_selection_options(p: argparse.ArgumentParser) -> None:
    """Which tensors go out, under which names, in which dtype."""
    add_filter_options(p)
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
    p.add_argument(
        "--selection",
        metavar="NAME",
        help="only the tensors of a named selection: one the layout proposes ('stage 1', 'expert 3', "
        "'TP split on dim 1', 'trainable', 'frozen', 'LoRA adapter') or one saved in the app with m; "
        "an unknown NAME lists the ones there are",
    )
    p.add_argument("--exclude-frozen", action="store_true", help="leave out frozen parameters")
    p.add_argument("--exclude-buffers", action="store_true", help="leave out buffers")
    p.add_argument(
        "--dedupe-tied",
        action="store_true",
        help="store tied weights once; the alias is recorded in the header metadata",
    )


def _add_hf_options(p: argparse.ArgumentParser) -> None:
    """The Hugging Face outputs' own options, in their own help group."""
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


def format_help() -> str:
    """`--format`'s help, from the kinds themselves (the default first): a new kind needs no line here."""
    from inspector.convert.kinds import DEFAULT, KINDS

    kinds = sorted(KINDS, key=lambda k: k.name != DEFAULT)
    said = [f"{k.name} ({'the default: ' if k.name == DEFAULT else ''}{k.help})" for k in kinds]
    return "the output kind: " + ", ".join(said)
