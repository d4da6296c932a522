"""`--format adapter`: the LoRA adapter in PEFT's layout (`adapter_model.safetensors` with PEFT's key names,
`adapter_config.json`), from the fp32 masters, for `PeftModel.from_pretrained`. `auto` writes the run's compute
dtype, as PEFT's `save_pretrained` does: a bf16 Trainer run saves a BF16 adapter (its module copies are the
masters rounded once, to nearest even, which is what our cast writes)."""

from __future__ import annotations

import re
from dataclasses import replace

from inspector.convert.kinds.base import Offer, Request, Why
from inspector.convert.kinds.safetensors import SafetensorsJob, SafetensorsKind, has_file
from inspector.convert.options import ConvertOptions
from inspector.convert.plan import ADAPTER_FILE, ConversionPlan, build_plan
from inspector.convert.writers.hf_folder import SideFile, find_side_files
from inspector.scan.model import Checkpoint
from inspector.scan.peft import ADAPTER_CONFIG, AdapterError, detect_adapter
from inspector.scan.peft import Adapter as LoraAdapter

NO_LORA = "no LoRA parameters in the checkpoint"
PEFT_RENAMES = (
    (r"\.(lora_A|lora_B)\.{name}\.(weight|bias)$", r".\1.\2"),
    (r"\.(lora_embedding_A|lora_embedding_B)\.{name}$", r".\1"),
    (r"\.modules_to_save\.{name}\.", "."),
    (r"\.lora_magnitude_vector\.{name}\.weight$", ".lora_magnitude_vector"),  # DoRA keeps its old key
)


def lora_adapter(ckpt: Checkpoint) -> LoraAdapter:
    """The checkpoint's LoRA adapter, or the one refusal when it holds none: what the adapter and merged kinds
    plan from."""
    adapter = detect_adapter(ckpt)
    if adapter is None:
        raise AdapterError(
            "The checkpoint holds no LoRA parameters (no *.lora_A.* / *.lora_B.* tensors).",
            hint="Convert it with --format model or weights.",
        )
    return adapter


class Adapter(SafetensorsKind):
    uses_selection = False  # every LoRA tensor, under PEFT's names, whatever is selected
    name = "adapter"
    label = "PEFT LoRA adapter"
    help = "PEFT LoRA adapter"  # `--format` help

    def offer(self, ckpt: Checkpoint) -> Offer:
        adapter = detect_adapter(ckpt)
        if adapter is None:
            return self._unavailable(Why.NO_LORA, NO_LORA, quiet=True)
        if adapter.config_path is None:
            return self._unavailable(Why.NO_ADAPTER_CONFIG, f"no {ADAPTER_CONFIG} beside the checkpoint")
        return self._available()

    def owns(self, out_dir: str) -> bool:
        return has_file(out_dir, ADAPTER_FILE)

    def plan(self, ckpt: Checkpoint, request: Request, out_dir: str) -> SafetensorsJob:
        adapter = lora_adapter(ckpt)
        if adapter.config_path is None:
            raise AdapterError(
                f"The checkpoint has LoRA parameters but no {ADAPTER_CONFIG} beside it ({ckpt.root}).",
                hint="PEFT needs the adapter's config (r, lora_alpha, target_modules). Trainer writes it into "
                "checkpoint-N/; copy it there from the run.",
            )
        opts = request.options
        only = replace(ckpt, tensors=tuple(ckpt.tensor(n) for n in adapter.tensors))
        name = re.escape(adapter.name)
        renames = tuple((pat.replace("{name}", name), repl) for pat, repl in PEFT_RENAMES)
        aopts = ConvertOptions(
            dtype=opts.dtype, shard_size=1 << 62, renames=renames, chunk_elems=opts.chunk_elems
        )
        plan = build_plan(only, aopts, allow_damaged=request.allow_damaged)
        plan = replace(plan, shards=(replace(plan.shards[0], filename=ADAPTER_FILE),), index=None)
        side = [SideFile(ADAPTER_CONFIG, adapter.config_path, origin=ckpt.source)]
        if request.side_files:
            side += [f for f in find_side_files([ckpt.source], model=False) if f.name != ADAPTER_CONFIG]
        notes = [
            f"Adapter {adapter.name!r}: {len(adapter.layers)} LoRA layer(s), r={adapter.r}, "
            f"lora_alpha={adapter.alpha}{', rsLoRA' if adapter.rslora else ''}; values from the fp32 masters, "
            f"written as {_dtype_word(plan)}."
        ]
        if opts.renames or opts.include or opts.exclude or opts.strip_prefix:
            notes.append(
                "The adapter keeps PEFT's names and all its tensors: --rename, --include, --exclude and "
                "--strip-prefix do not apply."
            )
        return SafetensorsJob(self.name, out_dir, plan, tuple(side), tuple(notes), uses_selection=False)


def _dtype_word(plan: ConversionPlan) -> str:
    """The adapter's one output dtype, as the note names it (`auto` resolved: the run's compute dtype)."""
    dtypes = sorted({t.out_dtype for s in plan.shards for t in s.tensors})
    return " and ".join(dtypes) or "nothing"
