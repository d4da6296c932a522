"""The outputs a checkpoint offers (plain weights, a loadable model folder, a PEFT adapter, a merged model),
how each is planned, and how it is written. The CLI and the TUI both go through here.

Every kind is an ordinary ConversionPlan (so preflight, the engine and the shard layout are shared) plus the
files written beside it; a merged model also carries its merges and is written by `writers.merge`.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import threading
from collections.abc import Iterator
from dataclasses import dataclass, replace
from enum import Enum

from inspector.convert.engine import Progress, Report, run
from inspector.convert.options import ConvertOptions, resolve_dtype
from inspector.convert.plan import ADAPTER_FILE, ConversionPlan, build_plan
from inspector.convert.writers.hf_folder import (
    SideFile,
    config_dtype_fix,
    find_side_files,
    has_model_config,
    model_folder_options,
)
from inspector.convert.writers.merge import MergedPlan, build_merged_plan, run_merged
from inspector.errors import InspectorError, OutputError
from inspector.scan.basemodel import base_source
from inspector.scan.model import Checkpoint, Kind
from inspector.scan.peft import ADAPTER_CONFIG, Adapter, AdapterError, detect_adapter
from inspector.system.source import Source

_PEFT_RENAMES = (
    (r"\.(lora_A|lora_B)\.{name}\.(weight|bias)$", r".\1.\2"),
    (r"\.(lora_embedding_A|lora_embedding_B)\.{name}$", r".\1"),
    (r"\.modules_to_save\.{name}\.", "."),
    (r"\.lora_magnitude_vector\.{name}\.weight$", ".lora_magnitude_vector"),  # DoRA keeps its old key
)


class OutputKind(str, Enum):
    WEIGHTS = "weights"  # safetensors shards and index only
    MODEL = "model"  # + config, generation config, tokenizer: a folder from_pretrained loads
    ADAPTER = "adapter"  # PEFT's adapter_model.safetensors + adapter_config.json
    MERGED = "merged"  # LoRA folded into the base weights: a plain model folder
    UNIVERSAL = "universal"  # a DeepSpeed universal checkpoint (`convert --format universal`)

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class OutputChoice:
    """One output a front end can offer for a checkpoint; `reason` says why it is unavailable."""

    kind: OutputKind
    label: str
    available: bool
    reason: str = ""
    flag: str = ""  # the CLI option that selects it


def output_kinds(ckpt: Checkpoint) -> list[OutputChoice]:
    """What `convert` can write for this checkpoint (for the TUI's export screen and `scan`)."""
    adapter = detect_adapter(ckpt)
    has_config = has_model_config(ckpt.root)
    out = [
        OutputChoice(OutputKind.WEIGHTS, "safetensors weights only", True, flag="--weights-only"),
        OutputChoice(
            OutputKind.MODEL,
            "Hugging Face model folder (weights + config + tokenizer)",
            has_config,
            "" if has_config else "no config.json beside the checkpoint (not a Trainer checkpoint)",
        ),
    ]
    if adapter is None:
        reason = "no LoRA parameters in the checkpoint"
        out += [
            OutputChoice(OutputKind.ADAPTER, "PEFT LoRA adapter", False, reason, "--adapter"),
            OutputChoice(
                OutputKind.MERGED, "model with the LoRA adapter merged", False, reason, "--merge-adapter"
            ),
        ]
        return [*out, _universal_choice(ckpt)]
    no_cfg = "" if adapter.config_path else f"no {ADAPTER_CONFIG} beside the checkpoint"
    out.append(OutputChoice(OutputKind.ADAPTER, "PEFT LoRA adapter", not no_cfg, no_cfg, "--adapter"))
    problems = "; ".join(adapter.problems)
    out.append(
        OutputChoice(
            OutputKind.MERGED, "model with the LoRA adapter merged", not problems, problems, "--merge-adapter"
        )
    )
    return [*out, _universal_choice(ckpt)]


ADAM = {"exp_avg", "exp_avg_sq"}


def _universal_choice(ckpt: Checkpoint) -> OutputChoice:
    """Universal needs the optimizer state: rank files with Adam moments for every trainable parameter."""
    reason = ""
    if not ckpt.ranks or ckpt.ranks[0].optim_file is None:
        reason = "no ZeRO optimizer files (already universal, or weights only)"
    elif ckpt.errors:
        reason = "the checkpoint has error findings"
    elif any(t.kind is Kind.TRAINABLE and {m for m, _ in t.moments} != ADAM for t in ckpt.tensors):
        reason = "not an Adam-family optimizer (no exp_avg / exp_avg_sq)"
    return OutputChoice(
        OutputKind.UNIVERSAL,
        "DeepSpeed universal checkpoint (resume on any world size)",
        not reason,
        reason,
        "--format universal",
    )


@dataclass(frozen=True)
class ExportPlan:
    """A ConversionPlan plus what is written beside it."""

    kind: OutputKind
    plan: ConversionPlan
    side_files: tuple[SideFile, ...] = ()
    notes: tuple[str, ...] = ()
    merged: MergedPlan | None = None

    @property
    def output_bytes(self) -> int:
        return self.plan.output_bytes + sum(f.nbytes for f in self.side_files)

    @property
    def extra_memory(self) -> int:
        """Working memory beyond the plan's chunk buffers (the merge's fp32 blocks and A/B)."""
        return self.merged.work_bytes if self.merged else 0

    @property
    def filenames(self) -> list[str]:
        return self.plan.filenames + [f.name for f in self.side_files]


def plan_export(
    ckpt: Checkpoint,
    opts: ConvertOptions,
    *,
    weights_only: bool = False,
    adapter: bool = False,
    merge: bool = False,
    base: str | None = None,
    allow_damaged: bool = False,
) -> ExportPlan:
    """Decide the output kind from the flags and the checkpoint, and plan it."""
    if adapter and merge:
        raise InspectorError("--adapter and --merge-adapter exclude each other.", title="Invalid option")
    if base and not merge:
        raise InspectorError("--base is only used with --merge-adapter.", title="Invalid option")
    if adapter or merge:
        found = detect_adapter(ckpt)
        if found is None:
            raise AdapterError(
                "The checkpoint holds no LoRA parameters (no *.lora_A.* / *.lora_B.* tensors).",
                hint="Convert it without --adapter / --merge-adapter.",
            )
        if adapter:
            return _adapter_plan(ckpt, opts, found, weights_only, allow_damaged)
        return _merged_plan(ckpt, opts, found, base, weights_only)
    notes: list[str] = []
    if detect_adapter(ckpt) is not None:
        notes.append(
            "The checkpoint holds a LoRA adapter: --adapter writes it in PEFT's layout, --merge-adapter "
            "merges it into the base model."
        )
    if weights_only or not has_model_config(ckpt.root):
        return ExportPlan(
            OutputKind.WEIGHTS, build_plan(ckpt, opts, allow_damaged=allow_damaged), (), tuple(notes)
        )
    hf_opts, more = model_folder_options(ckpt, opts)
    plan = build_plan(ckpt, hf_opts, allow_damaged=allow_damaged)
    side, note = config_dtype_fix(find_side_files([ckpt.source]), resolve_dtype(opts.dtype, ckpt))
    return ExportPlan(OutputKind.MODEL, plan, tuple(side), tuple(notes + more + ([note] if note else [])))


def _adapter_plan(
    ckpt: Checkpoint, opts: ConvertOptions, adapter: Adapter, weights_only: bool, allow_damaged: bool
) -> ExportPlan:
    if adapter.config_path is None:
        raise AdapterError(
            f"The checkpoint has LoRA parameters but no {ADAPTER_CONFIG} beside it ({ckpt.root}).",
            hint="PEFT needs the adapter's config (r, lora_alpha, target_modules). Trainer writes it into "
            "checkpoint-N/; copy it there from the run.",
        )
    only = replace(ckpt, tensors=tuple(ckpt.tensor(n) for n in adapter.tensors))
    name = re.escape(adapter.name)
    renames = tuple((pat.replace("{name}", name), repl) for pat, repl in _PEFT_RENAMES)
    dtype = "float32" if opts.dtype == "auto" else opts.dtype  # small; PEFT upcasts adapters to fp32 anyway
    aopts = ConvertOptions(dtype=dtype, shard_size=1 << 62, renames=renames, chunk_elems=opts.chunk_elems)
    plan = build_plan(only, aopts, allow_damaged=allow_damaged)
    plan = replace(plan, shards=(replace(plan.shards[0], filename=ADAPTER_FILE),), index=None)
    side = [SideFile(ADAPTER_CONFIG, adapter.config_path, origin=ckpt.source)]
    if not weights_only:
        side += [f for f in find_side_files([ckpt.source], model=False) if f.name != ADAPTER_CONFIG]
    notes = (
        f"Adapter {adapter.name!r}: {len(adapter.layers)} LoRA layer(s), r={adapter.r}, "
        f"lora_alpha={adapter.alpha}{', rsLoRA' if adapter.rslora else ''}; values from the fp32 masters.",
    )
    return ExportPlan(OutputKind.ADAPTER, plan, tuple(side), notes)


def _merged_plan(
    ckpt: Checkpoint, opts: ConvertOptions, adapter: Adapter, base: str | None, weights_only: bool
) -> ExportPlan:
    mp = build_merged_plan(ckpt, opts, adapter, base)
    side: list[SideFile] = []
    notes = list(mp.notes)
    if not weights_only:
        folders = [ckpt.source] + ([base_source(mp.base_folder)] if mp.base_folder else [])
        found = [f for f in find_side_files(folders) if f.name != ADAPTER_CONFIG]
        if not any(f.name == "config.json" for f in found):
            notes.append(
                "No config.json in the checkpoint or the base folder; pass --base DIR to include it."
            )
        side, note = config_dtype_fix(found, resolve_dtype(opts.dtype, ckpt))
        notes += [note] if note else []
    return ExportPlan(OutputKind.MERGED, mp.plan, tuple(side), tuple(notes), mp)


def run_export(
    xp: ExportPlan,
    out_dir: str,
    *,
    cancel: threading.Event | None = None,
    overwrite: bool = False,
    fsync: bool = False,
) -> Iterator[Progress | Report]:
    """Write the weights, then the side files (so a failed run never leaves a config that looks loadable)."""
    out_dir = os.path.abspath(out_dir)
    if xp.merged is not None:
        events = run_merged(xp.merged, out_dir, cancel=cancel, overwrite=overwrite, fsync=fsync)
    else:
        events = run(xp.plan, out_dir, cancel=cancel, overwrite=overwrite, fsync=fsync)
    for ev in events:
        if isinstance(ev, Report):
            files = ev.files + tuple(_write_side(f, out_dir, fsync) for f in xp.side_files)
            yield replace(ev, files=files, bytes_written=sum(s for _, s in files))
        else:
            yield ev


def _copy_regular(f: SideFile, dest: str) -> None:
    """Byte for byte from a descriptor opened through the file's folder (a link out of it, or a FIFO, is
    refused there), in the kernel where it can."""
    assert f.source is not None
    src = f.origin or Source.at(os.path.dirname(f.source))
    fd = src.open(f.source)
    try:
        with os.fdopen(os.dup(fd), "rb") as fin, open(dest, "wb") as fout:
            shutil.copyfileobj(fin, fout, 1 << 20)
    finally:
        os.close(fd)


def _write_side(f: SideFile, out_dir: str, fsync: bool) -> tuple[str, int]:
    dest = os.path.join(out_dir, f.name)
    tmp = dest + ".partial"
    try:
        if f.content is None:
            assert f.source is not None
            _copy_regular(f, tmp)
        else:
            with open(tmp, "wb") as fh:
                fh.write(f.content)
        if fsync:
            with open(tmp, "rb+") as fh:
                os.fsync(fh.fileno())
        os.replace(tmp, dest)
    except OSError as exc:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise OutputError(f"Writing {dest} failed: {exc.strerror}.") from None
    return f.name, os.path.getsize(dest)
