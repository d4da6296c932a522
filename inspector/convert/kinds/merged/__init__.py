"""`--format merged`: a plain model folder with every LoRA delta folded in, W + scale·B·A, computed block by
block by `merge.py` and run by the engine (locked, journalled, resumable), verified by recomputing."""

from __future__ import annotations

import threading
from collections.abc import Iterator

from inspector.convert.kinds.adapter import NO_LORA, lora_adapter
from inspector.convert.kinds.base import Offer, Request, VerifyProgress, VerifyResult, Why
from inspector.convert.kinds.merged.merge import build_merged_plan, is_merged_output, merged_shards
from inspector.convert.kinds.merged.verify import verify_merged
from inspector.convert.kinds.safetensors import SafetensorsJob, SafetensorsKind
from inspector.convert.options import resolve_dtype
from inspector.convert.writers.hf_folder import SideFile, config_dtype_fix, find_side_files
from inspector.remote.roots import absolute
from inspector.scan.basemodel import base_source
from inspector.scan.model import Checkpoint
from inspector.scan.peft import ADAPTER_CONFIG, detect_adapter


class Merged(SafetensorsKind):
    name = "merged"
    takes_base = True
    label = "model with the LoRA adapter merged"
    help = "the adapter merged into its base; --base names the base folder"  # `--format` help

    def offer(self, ckpt: Checkpoint) -> Offer:
        adapter = detect_adapter(ckpt)
        if adapter is None:
            return self._unavailable(Why.NO_LORA, NO_LORA, quiet=True)
        if adapter.problems:
            return self._unavailable(Why.ADAPTER_PROBLEM, "; ".join(adapter.problems))
        return self._available()

    def plan(self, ckpt: Checkpoint, request: Request, out_dir: str) -> SafetensorsJob:
        adapter = lora_adapter(ckpt)
        mp = build_merged_plan(
            ckpt, request.options, adapter, request.base, allow_damaged=request.allow_damaged
        )
        side: list[SideFile] = []
        notes = list(mp.notes)
        if request.side_files:
            folders = [ckpt.source] + ([base_source(mp.base_folder)] if mp.base_folder else [])
            found = [f for f in find_side_files(folders) if f.name != ADAPTER_CONFIG]
            if not any(f.name == "config.json" for f in found):
                notes.append(
                    "No config.json in the checkpoint or the base folder; pass --base DIR to include it."
                )
            side, note = config_dtype_fix(found, resolve_dtype(request.options.dtype, ckpt))
            notes += [note] if note else []
        return SafetensorsJob(
            self.name, out_dir, mp.plan, tuple(side), tuple(notes), merged_shards(mp), mp.work_bytes
        )

    def owns(self, out_dir: str) -> bool:
        return is_merged_output(out_dir)

    def verify(
        self,
        ckpt: Checkpoint,
        out_dir: str,
        *,
        against: str | None = None,
        cancel: threading.Event | None = None,
        base: str | None = None,
    ) -> Iterator[VerifyProgress | VerifyResult]:
        """`base`: the base folder to recompute from (verify's --base; default: where convert finds it)."""
        if against is not None:
            self.refuse_against("a merged model is checked by recomputing the merge from the fp32 masters.")
        return verify_merged(ckpt, absolute(out_dir), base=base, cancel=cancel)
