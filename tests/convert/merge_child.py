"""A merged export run in a child process, so that its peak RSS is the merge's own (`test_workers.py`).

    python tests/convert/merge_child.py DEMO_ROOT LORA_DIR OUT WORKERS

LORA_DIR holds a PEFT-named q_proj (its base weight and a LoRA pair) written by `write_lora`; the checkpoint
is the demo's scan with those tensors, as `tests/convert/kinds/hf.py` builds its small one."""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np

Q = "base_model.model.model.layers.0.self_attn.q_proj"


def write_lora(root: Path, rows: int, cols: int, rank: int) -> None:
    """An fp32 base weight of rows x cols with a rank-`rank` LoRA pair, and its adapter_config.json."""
    from safetensors.numpy import save_file

    rng = np.random.default_rng(0)
    root.mkdir(parents=True)
    pair = {
        f"{Q}.lora_A.default.weight": rng.standard_normal((rank, cols), np.float32),
        f"{Q}.lora_B.default.weight": rng.standard_normal((rows, rank), np.float32),
    }
    save_file(pair, str(root / "trained.safetensors"))
    base = rng.standard_normal((rows, cols), np.float32)
    save_file({f"{Q}.base_layer.weight": base}, str(root / "frozen.safetensors"))
    config = {"peft_type": "LORA", "r": rank, "lora_alpha": 2 * rank, "target_modules": ["q_proj"]}
    (root / "adapter_config.json").write_text(json.dumps(config | {"bias": "none"}))


def main(demo_root: str, lora: str, out: str, workers: int) -> None:
    from inspector.convert.kinds import Request, get
    from inspector.convert.options import ConvertOptions
    from inspector.scan.basemodel import read_safetensors
    from inspector.scan.model import Kind
    from inspector.scan.scanner import scan

    trained = [replace(t, kind=Kind.TRAINABLE) for t in read_safetensors(f"{lora}/trained.safetensors")]
    tensors = (*trained, *read_safetensors(f"{lora}/frozen.safetensors"))
    ckpt = replace(scan(demo_root), root=lora, tensors=tensors, findings=())
    request = Request(ConvertOptions(dtype="bf16", workers=workers), side_files=False)
    for _ in get("merged").plan(ckpt, request, out).run():
        pass


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]))
