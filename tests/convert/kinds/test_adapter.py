"""`--format adapter`: the LoRA adapter in PEFT's layout, without PEFT."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from safetensors.numpy import load_file

from inspector.convert.options import ConvertOptions
from inspector.convert.plan import ADAPTER_FILE
from inspector.scan.model import Kind
from inspector.scan.peft import detect_adapter, peft_key, plain_name
from inspector.scan.scanner import scan
from tests.convert.kinds.hf import SPEC, E, H, P, Q, lora_checkpoint, plan_export, write


def test_adapter_detected_with_peft_key_names(demo: Any, tmp_path: Path) -> None:
    ckpt = lora_checkpoint(demo, tmp_path)
    a = detect_adapter(ckpt)
    assert a is not None and a.name == "default" and a.r == 2 and a.alpha == 4 and not a.problems
    assert sorted(a.target_modules) == ["embed_tokens", "q_proj"]
    assert {ly.scale for ly in a.layers} == {2.0}
    assert peft_key(f"{Q}.lora_A.default.weight", "default") == f"{Q}.lora_A.weight"
    assert peft_key(f"{E}.lora_embedding_B.default", "default") == f"{E}.lora_embedding_B"
    assert peft_key(f"{H}.modules_to_save.default.weight", "default") == f"{H}.weight"
    assert plain_name(f"{Q}.base_layer.weight") == "model.layers.0.self_attn.q_proj.weight"

    xp = plan_export(ckpt, ConvertOptions(dtype="fp32"), adapter=True)
    write(xp, tmp_path / "out")
    got = load_file(tmp_path / "out" / ADAPTER_FILE)
    assert set(got) == {
        f"{Q}.lora_A.weight",
        f"{Q}.lora_B.weight",
        f"{E}.lora_embedding_A",
        f"{E}.lora_embedding_B",
        f"{H}.weight",
    }
    trained = load_file(Path(ckpt.root) / "trained.safetensors")
    for k, v in trained.items():
        assert np.array_equal(got[peft_key(k, "default")], v)  # fp32 masters, unrounded
    written = sorted(p.name for p in (tmp_path / "out").iterdir())
    assert written == ["adapter_config.json", ADAPTER_FILE, "tokenizer.json"]


def test_adapter_auto_dtype_is_the_compute_dtype(demo: Any, tmp_path: Path) -> None:
    """`auto` writes the run's compute dtype (bf16 here), as PEFT's save_pretrained does, each value the fp32
    master rounded once to nearest even; the note says which dtype it wrote (issue 42 item 5)."""
    ckpt = lora_checkpoint(demo, tmp_path)
    assert ckpt.compute_dtype == "bfloat16"
    xp = plan_export(ckpt, ConvertOptions(), adapter=True)
    assert {t.out_dtype for t in xp.plan.shards[0].tensors} == {"bfloat16"}
    assert any("written as bfloat16" in n for n in xp.notes)
    write(xp, tmp_path / "out")
    got = load_file(tmp_path / "out" / ADAPTER_FILE)
    trained = load_file(Path(ckpt.root) / "trained.safetensors")
    for k, v in trained.items():
        mine = got[peft_key(k, "default")]
        assert mine.dtype.name == "bfloat16" and np.array_equal(mine, v.astype(mine.dtype)), k


def test_adapter_auto_equals_peft_save_pretrained_bytes(tmp_path: Path) -> None:
    """The committed bf16 Trainer + PEFT run: with `auto`, our adapter_model.safetensors holds exactly the
    tensors PEFT's own save_pretrained wrote beside the checkpoint (dtype and bytes; PEFT's truth)."""
    from safetensors import safe_open

    run = Path(__file__).parents[2] / "fixtures" / "trainer_lora" / "run"
    ckpt = scan(str(run))
    write(plan_export(ckpt, ConvertOptions(), adapter=True), tmp_path / "out")
    with (
        safe_open(tmp_path / "out" / ADAPTER_FILE, "numpy") as ours,
        safe_open(run / "checkpoint-3" / ADAPTER_FILE, "numpy") as peft,
    ):
        keys = peft.keys()
        assert set(ours.keys()) == set(keys) and len(keys) == 12
        for k in keys:
            mine, theirs = ours.get_tensor(k), peft.get_tensor(k)
            assert mine.dtype == theirs.dtype and mine.dtype.name == "bfloat16", k
            assert mine.tobytes() == theirs.tobytes(), k


def test_scan_json_describes_the_adapter(demo: Any, tmp_path: Path) -> None:
    from inspector.scan.json_view import adapter_json, checkpoint_json

    ckpt = lora_checkpoint(demo, tmp_path, use_rslora=True)
    info = adapter_json(ckpt)
    assert info is not None
    assert info["layers"] == 2 and info["r"] == 2 and info["lora_alpha"] == 4 and info["use_rslora"] is True
    assert info["base_model_name_or_path"] == str(tmp_path / "base") and info["merge_problems"] == []
    assert checkpoint_json(scan(str(demo(SPEC))))["adapter"] is None


def test_adapter_with_trained_biases_keeps_peft_names(demo: Any, tmp_path: Path) -> None:
    ckpt = lora_checkpoint(demo, tmp_path, bias="lora_only")
    bias = replace(ckpt.tensor(f"{P}model.norm.weight"), name=f"{Q}.base_layer.bias", kind=Kind.TRAINABLE)
    ckpt = replace(ckpt, tensors=(*ckpt.tensors, bias))
    a = detect_adapter(ckpt)
    assert a is not None and f"{Q}.base_layer.bias" in a.tensors
    xp = plan_export(ckpt, ConvertOptions(), adapter=True)
    assert f"{Q}.base_layer.bias" in {t.name for t in xp.plan.shards[0].tensors}


def test_adapter_and_base_scanning_import_no_torch() -> None:
    import subprocess
    import sys

    code = "import sys, inspector.scan.peft, inspector.scan.basemodel, inspector.scan.summary; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


@pytest.mark.parametrize(
    "name",
    [
        f"{Q}.lora_A.default.weight",
        f"{Q}.lora_B.default.bias",
        f"{E}.lora_embedding_B.default",
        f"{H}.modules_to_save.default.weight",
        f"{Q}.lora_magnitude_vector.default.weight",
        f"{Q}.base_layer.bias",
        f"{P}model.default.lora_A.default.weight",  # a module named like the adapter keeps its name
    ],
)
def test_adapter_renames_agree_with_peft_key(name: str) -> None:
    import re

    from inspector.convert.kinds.adapter import PEFT_RENAMES as _PEFT_RENAMES

    out = name
    for pattern, repl in _PEFT_RENAMES:
        out = re.sub(pattern.replace("{name}", "default"), repl, out)
    assert out == peft_key(name, "default")


def test_a_broken_adapter_config_does_not_break_scan(demo: Any, tmp_path: Path) -> None:
    from inspector.scan.json_view import adapter_json

    ckpt = lora_checkpoint(demo, tmp_path)
    (Path(ckpt.root) / "adapter_config.json").write_text("{not json")
    info = adapter_json(ckpt)
    assert info is not None and "not readable JSON" in info["error"]


def test_verify_checks_an_adapter_folder_byte_for_byte(demo: Any, tmp_path: Path) -> None:
    """verify reads --adapter output (adapter_model.safetensors, PEFT names) through the names the export
    recorded: every adapter tensor compared, the base weights not called missing, a flipped byte caught."""
    from inspector.convert.verify import VerifyResult, run_verify

    ckpt = lora_checkpoint(demo, tmp_path)
    out = tmp_path / "adapter"
    write(plan_export(ckpt, ConvertOptions(), adapter=True), out)

    def verify() -> VerifyResult:
        *_, res = run_verify(ckpt, str(out))
        assert isinstance(res, VerifyResult)
        return res

    res = verify()
    assert res.ok and res.checked == 5 and not res.missing and not res.unexpected, res
    path = out / ADAPTER_FILE
    data = bytearray(path.read_bytes())
    data[-1] ^= 0x01  # the last byte of the last tensor's data
    path.write_bytes(bytes(data))
    res = verify()
    assert not res.ok and len(res.mismatched) == 1 and not res.missing and not res.unexpected, res
    assert res.mismatched[0] in set(load_file(path))  # named as PEFT names it
