"""`--format weights`: the checkpoint's tensors as safetensors shards and index, nothing else."""

from __future__ import annotations

from inspector.convert.kinds.base import Offer, Request
from inspector.convert.kinds.safetensors import SafetensorsJob, SafetensorsKind
from inspector.convert.plan import build_plan
from inspector.scan.model import Checkpoint
from inspector.scan.peft import detect_adapter

ADAPTER_NOTE = (
    "The checkpoint holds a LoRA adapter: --format adapter writes it in PEFT's layout, --format merged merges "
    "it into the base model."
)


class Weights(SafetensorsKind):
    name = "weights"
    label = "safetensors weights only"
    help = "safetensors only"  # `--format` help

    def offer(self, ckpt: Checkpoint) -> Offer:
        return self._available()

    def plan(self, ckpt: Checkpoint, request: Request, out_dir: str) -> SafetensorsJob:
        notes = (ADAPTER_NOTE,) if detect_adapter(ckpt) is not None else ()
        plan = build_plan(ckpt, request.options, allow_damaged=request.allow_damaged)
        return SafetensorsJob(self.name, out_dir, plan, notes=notes)
