"""`--format model`: a Hugging Face model folder, the weights plus the Trainer checkpoint's config, generation
config and tokenizer, so `from_pretrained(OUT)` loads it. Without a config beside the checkpoint it is the
weights alone (and says so)."""

from __future__ import annotations

from inspector.convert.kinds.base import Offer, Request, Why
from inspector.convert.kinds.safetensors import SafetensorsJob, SafetensorsKind, has_file
from inspector.convert.kinds.weights import ADAPTER_NOTE
from inspector.convert.options import resolve_dtype
from inspector.convert.plan import build_plan
from inspector.convert.writers.hf_folder import (
    config_dtype_fix,
    find_side_files,
    has_model_config,
    model_folder_options,
)
from inspector.scan.model import Checkpoint
from inspector.scan.peft import detect_adapter


class Model(SafetensorsKind):
    name = "model"
    label = "Hugging Face model folder (weights + config + tokenizer)"
    help = (  # `--format` help
        "safetensors plus a Trainer checkpoint's config and tokenizer; `safetensors` is the same"
    )

    def offer(self, ckpt: Checkpoint) -> Offer:
        if not has_model_config(ckpt.root):
            if detect_adapter(ckpt) is not None:  # a LoRA Trainer checkpoint: the adapter is all it saves
                why = "no config.json beside the checkpoint (a LoRA run saves only its adapter: choose the merge)"
                return self._unavailable(Why.NO_CONFIG, why)
            return self._unavailable(Why.NO_CONFIG, "no config.json beside the checkpoint (not a Trainer checkpoint)")
        return self._available()

    def owns(self, out_dir: str) -> bool:
        return super().owns(out_dir) and has_file(out_dir, "config.json")

    def plan(self, ckpt: Checkpoint, request: Request, out_dir: str) -> SafetensorsJob:
        notes = [ADAPTER_NOTE] if detect_adapter(ckpt) is not None else []
        if not request.side_files or not has_model_config(ckpt.root):
            plan = build_plan(ckpt, request.options, allow_damaged=request.allow_damaged)
            return SafetensorsJob("weights", out_dir, plan, notes=tuple(notes))
        opts, more = model_folder_options(ckpt, request.options)
        plan = build_plan(ckpt, opts, allow_damaged=request.allow_damaged)
        side, note = config_dtype_fix(
            find_side_files([ckpt.source]), resolve_dtype(request.options.dtype, ckpt)
        )
        notes += more + ([note] if note else [])
        return SafetensorsJob(self.name, out_dir, plan, tuple(side), tuple(notes))
