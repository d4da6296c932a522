"""What the safetensors-kind tests share: a Trainer-style run folder, a LoRA checkpoint over small safetensors
files, the merge written out in numpy, and the registry's job for a kind."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
from safetensors.numpy import load_file, save_file

from inspector.convert.kinds import Request, get
from inspector.convert.options import ConvertOptions
from inspector.demo.writer import DemoSpec
from inspector.scan.basemodel import read_safetensors
from inspector.scan.model import Checkpoint, Kind
from inspector.scan.peft import plain_name
from inspector.scan.scanner import scan

SPEC = DemoSpec(stage=2, world_size=2, dtype="bf16", params=200_000)
SIDE = {
    "config.json": json.dumps(
        {"model_type": "llama", "dtype": "bfloat16", "tie_word_embeddings": True}, indent=2
    ),
    "generation_config.json": '{"bos_token_id": 1}\n',
    "tokenizer.json": '{"version": "1.0", "model": {}}',
    "tokenizer_config.json": '{"model_max_length": 64}',
    "special_tokens_map.json": '{"eos_token": "</s>"}',
    "chat_template.jinja": "{{ messages }}",
    "vocab.json": "{}",
    "merges.txt": "#version: 0.2\n",
    "added_tokens.json": "{}",
}
PRIVATE = (
    "training_args.bin",
    "trainer_state.json",
    "rng_state_0.pth",
    "scheduler.pt",
    "optimizer.pt",
    "zero_to_fp32.py",
)


def trainer_run(demo: Any, tmp_path: Path) -> Path:
    ckpt = demo.copy(SPEC, tmp_path / "run" / "checkpoint-6")
    for name, text in SIDE.items():
        (ckpt / name).write_text(text)
    for name in PRIVATE:
        (ckpt / name).write_bytes(b"private")
    return tmp_path / "run"


P = "base_model.model."
Q = P + "model.layers.0.self_attn.q_proj"
E = P + "model.embed_tokens"
H = P + "lm_head"


def lora_checkpoint(demo: Any, tmp_path: Path, *, with_base: bool = True, **config: Any) -> Checkpoint:
    """A checkpoint whose tensors are a PEFT-wrapped model's: q_proj (Linear) and embed_tokens (Embedding) with
    LoRA, lm_head in modules_to_save."""
    rng = np.random.default_rng(0)
    f32 = np.float32
    arrays = {
        f"{Q}.lora_A.default.weight": rng.standard_normal((2, 6)).astype(f32),
        f"{Q}.lora_B.default.weight": rng.standard_normal((8, 2)).astype(f32),
        f"{E}.lora_embedding_A.default": rng.standard_normal((2, 10)).astype(f32),
        f"{E}.lora_embedding_B.default": rng.standard_normal((6, 2)).astype(f32),
        f"{H}.modules_to_save.default.weight": rng.standard_normal((10, 6)).astype(f32),
    }
    fan = bool(config.get("fan_in_fan_out"))
    frozen = {
        f"{Q}.base_layer.weight": rng.standard_normal((6, 8) if fan else (8, 6)).astype(f32),
        f"{E}.base_layer.weight": rng.standard_normal((10, 6)).astype(f32),
        f"{H}.original_module.weight": rng.standard_normal((10, 6)).astype(f32),
        f"{P}model.norm.weight": rng.standard_normal(6).astype(f32),
    }
    root = tmp_path / "ckpt"
    root.mkdir(parents=True)
    save_file(arrays, str(root / "trained.safetensors"))
    tensors = [replace(t, kind=Kind.TRAINABLE) for t in read_safetensors(str(root / "trained.safetensors"))]
    base = tmp_path / "base"
    base.mkdir()
    save_file(
        {plain_name(k): v for k, v in frozen.items() if "original_module" not in k}
        | {"lm_head.weight": frozen[f"{H}.original_module.weight"]},
        str(base / "model.safetensors"),
    )
    (base / "config.json").write_text('{"model_type": "llama", "dtype": "float32"}')
    if with_base:
        save_file(frozen, str(root / "frozen.safetensors"))
        tensors += read_safetensors(str(root / "frozen.safetensors"))
    cfg = {
        "peft_type": "LORA",
        "r": 2,
        "lora_alpha": 4,
        "target_modules": ["q_proj", "embed_tokens"],
        "modules_to_save": ["lm_head"],
        "base_model_name_or_path": str(base),
        "bias": "none",
        "use_rslora": False,
        "fan_in_fan_out": False,
        **config,
    }
    (root / "adapter_config.json").write_text(json.dumps(cfg))
    (root / "tokenizer.json").write_text("{}")
    ckpt = scan(str(demo(SPEC)))
    return replace(ckpt, root=str(root), tensors=tuple(tensors), findings=())


def offered_checkpoint(kind: str, demo: Any, tmp_path: Path, spec: DemoSpec) -> Checkpoint:
    """A checkpoint `kind` is offered for: a Trainer run for `model`, a LoRA run for the adapter kinds, the
    `spec` demo for the rest."""
    if kind in ("adapter", "merged"):
        return lora_checkpoint(demo, tmp_path)
    if kind == "model":
        return scan(str(trainer_run(demo, tmp_path)))
    return scan(str(demo(spec)))


def expected(ckpt: Checkpoint, q_scale: float, e_scale: float, fan: bool = False) -> dict[str, np.ndarray]:
    t = {**load_file(Path(ckpt.root) / "trained.safetensors"), **base_arrays(ckpt)}
    q_delta = t[f"{Q}.lora_B.default.weight"] @ t[f"{Q}.lora_A.default.weight"]
    return {
        "model.layers.0.self_attn.q_proj.weight": t[f"{Q}.base_layer.weight"]
        + (q_delta.T if fan else q_delta) * np.float32(q_scale),
        "model.embed_tokens.weight": t[f"{E}.base_layer.weight"]
        + (t[f"{E}.lora_embedding_B.default"] @ t[f"{E}.lora_embedding_A.default"]).T * np.float32(e_scale),
        "lm_head.weight": t[f"{H}.modules_to_save.default.weight"],
        "model.norm.weight": t[f"{P}model.norm.weight"],
    }


def base_arrays(ckpt: Checkpoint) -> dict[str, np.ndarray]:
    frozen = Path(ckpt.root) / "frozen.safetensors"
    if frozen.exists():
        return load_file(frozen)
    base = load_file(Path(ckpt.root).parent / "base" / "model.safetensors")
    return {
        f"{Q}.base_layer.weight": base["model.layers.0.self_attn.q_proj.weight"],
        f"{E}.base_layer.weight": base["model.embed_tokens.weight"],
        f"{P}model.norm.weight": base["model.norm.weight"],
    }


def plan_export(
    ckpt: Checkpoint,
    opts: ConvertOptions,
    *,
    adapter: bool = False,
    merge: bool = False,
    base: str | None = None,
    out: str = "out",
) -> Any:
    """The registry's job for the kind the old flags named (model when none)."""
    kind = get("adapter" if adapter else "merged" if merge else "model")
    return kind.plan(ckpt, Request(opts, base=base), out)


def write(xp: Any, out: Path) -> None:
    for _ in replace(xp, out_dir=str(out)).run():
        pass
