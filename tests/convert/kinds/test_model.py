"""`--format model`: a Trainer checkpoint becomes a Hugging Face model folder (config, tokenizer beside the weights)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from safetensors.numpy import load_file

from tests.convert.kinds.hf import SIDE, trainer_run


def test_trainer_checkpoint_becomes_a_model_folder(demo: Any, tmp_path: Path, cli: Any) -> None:
    run = trainer_run(demo, tmp_path)
    out = tmp_path / "out"
    rc, stdout, stderr = cli("convert", run, out)
    assert rc == 0, stdout + stderr
    names = sorted(p.name for p in out.iterdir())
    assert names == sorted([*SIDE, "model.safetensors"])
    for name in SIDE:  # byte for byte: the config already says bf16, which is what is written
        assert (out / name).read_bytes() == (run / "checkpoint-6" / name).read_bytes()
    keys = set(load_file(out / "model.safetensors"))
    assert (
        "model.embed_tokens.weight" in keys and "lm_head.weight" not in keys
    )  # tied: stored once, as HF does
    assert "(model)" in stdout and "Tied weights stored once" in stdout


def test_config_dtype_states_the_truth(demo: Any, tmp_path: Path, cli: Any) -> None:
    run = trainer_run(demo, tmp_path)
    rc, stdout, stderr = cli("convert", run / "checkpoint-6", tmp_path / "out", "--dtype", "fp32")
    assert rc == 0, stdout + stderr
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert config["dtype"] == "float32" and config["tie_word_embeddings"] is True
    assert "config.json says bfloat16" in stdout


def test_preflight_counts_the_side_files(demo: Any, tmp_path: Path, cli: Any) -> None:
    run = trainer_run(demo, tmp_path)
    rc, stdout, _ = cli("preflight", run, "--json")
    data = json.loads(stdout)
    assert data["output_kind"] == "model" and "config.json" in data["files"]
    rc, stdout, stderr = cli("convert", run, tmp_path / "out")
    assert rc == 0, stdout + stderr
    assert data["output_bytes"] == sum(p.stat().st_size for p in (tmp_path / "out").iterdir())  # exact


# --- LoRA -------------------------------------------------------------------------------------------------------
