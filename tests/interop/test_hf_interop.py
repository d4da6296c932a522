"""Hugging Face-ready outputs against real transformers, PEFT and DeepSpeed (issue 12).

A tiny Llama-style causal LM is trained a few steps under Hugging Face Trainer with a DeepSpeed config on 2 CPU
ranks (gloo, DS_ACCELERATOR=cpu; Trainer runs DeepSpeed on the CPU with `use_cpu=True`): a full ZeRO-3 run
with tied embeddings, and a PEFT LoRA run under ZeRO-2 (which Trainer saves with exclude_frozen_parameters, so
the base weights come from the base folder the adapter_config names). Our outputs are then loaded by
transformers and PEFT themselves and compared with DeepSpeed's own reconstruction (ds_reference.py).
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

pytestmark = pytest.mark.interop
HERE = Path(__file__).resolve().parent


def _reference(work: Path) -> dict[str, torch.Tensor]:
    raw = torch.load(work / "reference.pt", map_location="cpu", weights_only=True)
    return dict(raw["tensors"])


def _convert(inspector_cli: Callable[..., Any], *args: str) -> None:
    proc = inspector_cli("convert", *args)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_trainer_zero3_model_folder_loads(
    hf_run: Callable[[str], Path], inspector_cli: Any, tmp_path: Path
) -> None:
    """from_pretrained loads our fp32 output with no missing/unexpected keys; logits equal DeepSpeed's model."""
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaForCausalLM

    work = hf_run("full")
    ckpt = next((work / "run").glob("checkpoint-*"))
    out = tmp_path / "model"
    _convert(inspector_cli, str(work / "run"), str(out), "--dtype", "fp32")
    names = sorted(p.name for p in out.iterdir())
    for f in (
        "config.json",
        "generation_config.json",
        "tokenizer.json",
        "tokenizer_config.json",
        "chat_template.jinja",
    ):
        assert f in names
        if f != "config.json":
            assert (out / f).read_bytes() == (ckpt / f).read_bytes(), f
    assert not {"training_args.bin", "trainer_state.json", "latest", "rng_state_0.pth"} & set(names)
    assert not any(n.startswith("zero_to") or n.startswith("global_step") for n in names)
    config = json.loads((out / "config.json").read_text())
    assert config["dtype"] == "float32"  # the run said bfloat16; the weights written are fp32

    model, info = AutoModelForCausalLM.from_pretrained(out, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"], info
    assert model.dtype == torch.float32

    ref = LlamaForCausalLM(model.config).eval()
    state = _reference(work)
    result = ref.load_state_dict(state, strict=False)
    assert not result.unexpected_keys and set(result.missing_keys) <= {"lm_head.weight"}, result
    ref.tie_weights()
    ids = torch.tensor([[5, 9, 12, 7, 30, 2]])
    with torch.no_grad():
        assert torch.equal(model.eval()(ids).logits, ref(ids).logits)

    ours, theirs = AutoTokenizer.from_pretrained(out), AutoTokenizer.from_pretrained(ckpt)
    text = "the quick brown fox jumps over a zero checkpoint"
    assert ours(text)["input_ids"] == theirs(text)["input_ids"]
    assert ours.apply_chat_template(
        [{"role": "user", "content": text}], tokenize=False
    ) == theirs.apply_chat_template([{"role": "user", "content": text}], tokenize=False)


def test_trainer_bf16_model_folder_is_what_save_pretrained_writes(
    hf_run: Callable[[str], Path], inspector_cli: Any, tmp_path: Path
) -> None:
    """Default dtype (the run's bf16): config copied byte for byte, tied weight stored once like save_pretrained."""
    from safetensors import safe_open
    from transformers import AutoModelForCausalLM

    work = hf_run("full")
    ckpt = next((work / "run").glob("checkpoint-*"))
    out = tmp_path / "bf16"
    _convert(inspector_cli, str(ckpt), str(out))
    assert (out / "config.json").read_bytes() == (ckpt / "config.json").read_bytes()
    with safe_open(out / "model.safetensors", "pt") as f:
        keys = set(f.keys())
    model, info = AutoModelForCausalLM.from_pretrained(out, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    assert keys == set(model.state_dict()) - {"lm_head.weight"}
    assert model.dtype == torch.bfloat16

    weights_only = tmp_path / "weights"
    _convert(inspector_cli, str(ckpt), str(weights_only), "--weights-only")
    assert sorted(p.name for p in weights_only.iterdir()) == ["model.safetensors"]


def _trained_adapter(work: Path) -> dict[str, torch.Tensor]:
    """PEFT keys -> DeepSpeed's fp32 reconstruction of the trained adapter."""
    from inspector.scan.peft import peft_key

    return {peft_key(k, "default"): v for k, v in _reference(work).items() if ".lora_" in k}


@pytest.mark.parametrize("run", ["lora", "rslora", "lora_zero3"])
def test_lora_adapter_export_loads_in_peft(
    run: str, hf_run: Callable[[str], Path], inspector_cli: Any, tmp_path: Path
) -> None:
    """--adapter (dtype auto) writes what PEFT's save_pretrained wrote beside the checkpoint, dtype and bytes
    (the run's bf16); PeftModel.from_pretrained(base, OUT) on --dtype fp32 output holds exactly the trained
    (fp32 master) adapter, and on the auto output those masters rounded to bf16."""
    from peft import PeftModel
    from peft.utils import get_peft_model_state_dict
    from safetensors import safe_open
    from transformers import AutoModelForCausalLM

    work = hf_run(run)
    ckpt = next((work / "run").glob("checkpoint-*"))
    scanned = inspector_cli("scan", str(work / "run"), "--json")
    adapter = json.loads(scanned.stdout)["adapter"]
    assert adapter["layers"] == 6 and adapter["r"] == 4 and adapter["lora_alpha"] == 8
    assert adapter["use_rslora"] is (run == "rslora") and adapter["base_model_name_or_path"] == str(
        work / "base"
    )
    out = tmp_path / "adapter"
    _convert(inspector_cli, str(work / "run"), str(out), "--adapter")
    assert (out / "adapter_config.json").read_bytes() == (ckpt / "adapter_config.json").read_bytes()
    with (
        safe_open(out / "adapter_model.safetensors", "pt") as ours,
        safe_open(ckpt / "adapter_model.safetensors", "pt") as trainers,
    ):
        keys = ours.keys()
        assert set(keys) == set(trainers.keys())  # exactly PEFT's own key names
        for k in keys:  # PEFT saves the adapter in the compute dtype: so does auto
            mine, theirs = ours.get_tensor(k), trainers.get_tensor(k)
            assert mine.dtype == theirs.dtype == torch.bfloat16 and torch.equal(mine, theirs), k
    fp32 = tmp_path / "adapter32"
    _convert(inspector_cli, str(work / "run"), str(fp32), "--adapter", "--dtype", "fp32")
    trained = _trained_adapter(work)
    for folder, rounded in ((fp32, False), (out, True)):
        model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(work / "base"), folder)
        loaded = get_peft_model_state_dict(model)
        assert set(loaded) == set(trained)
        for k, v in trained.items():
            want = v.to(torch.bfloat16).to(loaded[k].dtype) if rounded else v
            assert torch.equal(loaded[k], want), (folder.name, k)


@pytest.mark.parametrize("run", ["lora", "rslora", "lora_zero3"])
def test_lora_merge_equals_peft_merge_and_unload(
    run: str, hf_run: Callable[[str], Path], inspector_cli: Any, tmp_path: Path
) -> None:
    """--merge-adapter output equals PEFT's merge_and_unload() of the trained adapter (fp32, allclose)."""
    from peft import PeftModel, set_peft_model_state_dict
    from transformers import AutoModelForCausalLM

    work = hf_run(run)
    out = tmp_path / "merged"
    _convert(inspector_cli, str(work / "run"), str(out), "--merge-adapter", "--dtype", "fp32")
    names = {p.name for p in out.iterdir()}
    assert {"config.json", "generation_config.json", "tokenizer.json", "model.safetensors"} <= names
    assert not {"adapter_config.json", "adapter_model.safetensors"} & names

    ours, info = AutoModelForCausalLM.from_pretrained(out, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    assert not any("lora" in k for k in ours.state_dict())

    ckpt = next((work / "run").glob("checkpoint-*"))
    base = AutoModelForCausalLM.from_pretrained(work / "base")
    untouched = {k: v.clone() for k, v in base.state_dict().items()}  # merge_and_unload works in place
    peft_model = PeftModel.from_pretrained(base, ckpt)  # config from the checkpoint ...
    set_peft_model_state_dict(peft_model, _trained_adapter(work))  # ... values: DeepSpeed's fp32 masters
    theirs = peft_model.merge_and_unload().state_dict()
    mine = ours.state_dict()
    assert set(mine) == set(theirs)
    for k, v in theirs.items():
        torch.testing.assert_close(mine[k], v, rtol=1e-6, atol=1e-6, msg=k)
    changed = {k.split(".")[-2] for k in theirs if not torch.equal(theirs[k], untouched[k])}
    assert changed == {"q_proj", "v_proj", "up_proj"}  # the adapted layers, and only those
    verified = inspector_cli("verify", str(work / "run"), str(out))  # recomputes the merge, independently
    assert verified.returncode == 0 and "merged output" in verified.stdout, verified.stdout + verified.stderr


def test_merge_without_base_says_where_to_look(
    hf_run: Callable[[str], Path], inspector_cli: Any, tmp_path: Path
) -> None:
    """A LoRA checkpoint holds no base weights; a missing base folder is named, never downloaded."""
    work = hf_run("lora")
    ckpt = next((work / "run").glob("checkpoint-*"))
    copy = tmp_path / "ckpt"
    shutil.copytree(ckpt, copy)
    cfg = json.loads((copy / "adapter_config.json").read_text())
    cfg["base_model_name_or_path"] = "meta-llama/not-here"
    (copy / "adapter_config.json").write_text(json.dumps(cfg))
    proc = inspector_cli("convert", str(copy), str(tmp_path / "out"), "--merge-adapter")
    assert proc.returncode == 2
    assert "meta-llama/not-here" in proc.stderr and "--base" in proc.stderr
    _convert(inspector_cli, str(copy), str(tmp_path / "out"), "--merge-adapter", "--base", str(work / "base"))
