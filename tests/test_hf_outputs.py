"""Hugging Face outputs without transformers or PEFT: a Trainer-style model folder, PEFT adapter keys, LoRA merges.

The model-folder tests lay a demo checkpoint out as Trainer does (`run/checkpoint-N/` with config, tokenizer and
Trainer-private files beside the DeepSpeed files). The LoRA tests build a checkpoint whose tensors are PEFT's
names over small safetensors files, and check the merge against numpy arithmetic written out here.
"""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from inspector.convert.export import ADAPTER_FILE, OutputKind, output_kinds, plan_export, run_export
from inspector.convert.options import ConvertOptions
from inspector.demo.writer import DemoSpec
from inspector.errors import UnsupportedCheckpointError
from inspector.scan.basemodel import BaseModelError, read_safetensors
from inspector.scan.model import Checkpoint, Kind
from inspector.scan.peft import detect_adapter, peft_key, plain_name
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


def _trainer_run(demo: Any, tmp_path: Path) -> Path:
    ckpt = demo.copy(SPEC, tmp_path / "run" / "checkpoint-6")
    for name, text in SIDE.items():
        (ckpt / name).write_text(text)
    for name in PRIVATE:
        (ckpt / name).write_bytes(b"private")
    return tmp_path / "run"


def test_trainer_checkpoint_becomes_a_model_folder(demo: Any, tmp_path: Path, cli: Any) -> None:
    run = _trainer_run(demo, tmp_path)
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
    run = _trainer_run(demo, tmp_path)
    rc, stdout, stderr = cli("convert", run / "checkpoint-6", tmp_path / "out", "--dtype", "fp32")
    assert rc == 0, stdout + stderr
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert config["dtype"] == "float32" and config["tie_word_embeddings"] is True
    assert "config.json says bfloat16" in stdout


def test_weights_only_and_plain_checkpoints_write_just_weights(demo: Any, tmp_path: Path, cli: Any) -> None:
    run = _trainer_run(demo, tmp_path)
    rc, stdout, stderr = cli("convert", run, tmp_path / "w", "--weights-only")
    assert rc == 0, stdout + stderr
    assert sorted(p.name for p in (tmp_path / "w").iterdir()) == ["model.safetensors"]
    keys = set(load_file(tmp_path / "w" / "model.safetensors"))
    assert "lm_head.weight" in keys  # plain conversion keeps every name, as before
    ckpt = scan(str(demo(SPEC)))
    kinds = {c.kind: c for c in output_kinds(ckpt)}
    assert kinds[OutputKind.WEIGHTS].available and not kinds[OutputKind.MODEL].available
    assert not kinds[OutputKind.ADAPTER].available
    assert plan_export(ckpt, ConvertOptions()).kind is OutputKind.WEIGHTS


def test_preflight_counts_the_side_files(demo: Any, tmp_path: Path, cli: Any) -> None:
    run = _trainer_run(demo, tmp_path)
    rc, stdout, _ = cli("preflight", run, "--json")
    data = json.loads(stdout)
    assert data["output_kind"] == "model" and "config.json" in data["files"]
    rc, stdout, stderr = cli("convert", run, tmp_path / "out")
    assert rc == 0, stdout + stderr
    assert data["output_bytes"] == sum(p.stat().st_size for p in (tmp_path / "out").iterdir())  # exact


# --- LoRA -------------------------------------------------------------------------------------------------------

P = "base_model.model."
Q = P + "model.layers.0.self_attn.q_proj"
E = P + "model.embed_tokens"
H = P + "lm_head"


def _lora_checkpoint(demo: Any, tmp_path: Path, *, with_base: bool = True, **config: Any) -> Checkpoint:
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


def _expected(ckpt: Checkpoint, q_scale: float, e_scale: float, fan: bool = False) -> dict[str, np.ndarray]:
    t = {**load_file(Path(ckpt.root) / "trained.safetensors"), **_base_arrays(ckpt)}
    q_delta = t[f"{Q}.lora_B.default.weight"] @ t[f"{Q}.lora_A.default.weight"]
    return {
        "model.layers.0.self_attn.q_proj.weight": t[f"{Q}.base_layer.weight"]
        + (q_delta.T if fan else q_delta) * np.float32(q_scale),
        "model.embed_tokens.weight": t[f"{E}.base_layer.weight"]
        + (t[f"{E}.lora_embedding_B.default"] @ t[f"{E}.lora_embedding_A.default"]).T * np.float32(e_scale),
        "lm_head.weight": t[f"{H}.modules_to_save.default.weight"],
        "model.norm.weight": t[f"{P}model.norm.weight"],
    }


def _base_arrays(ckpt: Checkpoint) -> dict[str, np.ndarray]:
    frozen = Path(ckpt.root) / "frozen.safetensors"
    if frozen.exists():
        return load_file(frozen)
    base = load_file(Path(ckpt.root).parent / "base" / "model.safetensors")
    return {
        f"{Q}.base_layer.weight": base["model.layers.0.self_attn.q_proj.weight"],
        f"{E}.base_layer.weight": base["model.embed_tokens.weight"],
        f"{P}model.norm.weight": base["model.norm.weight"],
    }


def _write(xp: Any, out: Path) -> None:
    for _ in run_export(xp, str(out)):
        pass


def test_adapter_detected_with_peft_key_names(demo: Any, tmp_path: Path) -> None:
    ckpt = _lora_checkpoint(demo, tmp_path)
    a = detect_adapter(ckpt)
    assert a is not None and a.name == "default" and a.r == 2 and a.alpha == 4 and not a.problems
    assert sorted(a.target_modules) == ["embed_tokens", "q_proj"]
    assert {ly.scale for ly in a.layers} == {2.0}
    assert peft_key(f"{Q}.lora_A.default.weight", "default") == f"{Q}.lora_A.weight"
    assert peft_key(f"{E}.lora_embedding_B.default", "default") == f"{E}.lora_embedding_B"
    assert peft_key(f"{H}.modules_to_save.default.weight", "default") == f"{H}.weight"
    assert plain_name(f"{Q}.base_layer.weight") == "model.layers.0.self_attn.q_proj.weight"

    xp = plan_export(ckpt, ConvertOptions(), adapter=True)
    _write(xp, tmp_path / "out")
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


@pytest.mark.parametrize(
    ("config", "q_scale", "e_scale"),
    [
        ({}, 2.0, 2.0),
        ({"use_rslora": True}, 4 / math.sqrt(2), 4 / math.sqrt(2)),
        ({"alpha_pattern": {"q_proj": 16}}, 8.0, 2.0),
        ({"fan_in_fan_out": True}, 2.0, 2.0),  # Conv1D (GPT-2) weights are stored (in, out)
    ],
)
@pytest.mark.parametrize("chunk", [1 << 22, 7])  # whole tensors, and row blocks of one row
def test_merge_matches_numpy(
    demo: Any, tmp_path: Path, config: dict, q_scale: float, e_scale: float, chunk: int
) -> None:
    ckpt = _lora_checkpoint(demo, tmp_path, **config)
    xp = plan_export(ckpt, ConvertOptions(dtype="fp32", chunk_elems=chunk), merge=True)
    assert xp.kind is OutputKind.MERGED and xp.merged is not None and xp.merged.base_folder is None
    _write(xp, tmp_path / "out")
    got = load_file(tmp_path / "out" / "model.safetensors")
    want = _expected(ckpt, q_scale, e_scale, fan=bool(config.get("fan_in_fan_out")))
    assert set(got) == set(want)
    for k, v in want.items():
        np.testing.assert_allclose(got[k], v, rtol=1e-6, atol=1e-6, err_msg=k)
    assert not any("lora" in k for k in got)


def test_merge_from_base_folder_in_bf16(demo: Any, tmp_path: Path) -> None:
    ckpt = _lora_checkpoint(demo, tmp_path, with_base=False)
    xp = plan_export(ckpt, ConvertOptions(dtype="bf16"), merge=True)
    assert xp.merged is not None and xp.merged.base_folder == str(tmp_path / "base")
    assert {f.name for f in xp.side_files} == {"config.json", "tokenizer.json"}
    _write(xp, tmp_path / "out")
    raw = load_file(tmp_path / "out" / "model.safetensors")
    for k, v in _expected(ckpt, 2.0, 2.0).items():
        assert raw[k].dtype == ml_dtypes.bfloat16
        assert np.array_equal(raw[k].view(np.uint16), v.astype(ml_dtypes.bfloat16).view(np.uint16)), k
    assert json.loads((tmp_path / "out" / "config.json").read_text())["dtype"] == "bfloat16"


def test_merge_refusals_are_clear(demo: Any, tmp_path: Path) -> None:
    dora = _lora_checkpoint(demo, tmp_path / "a", use_dora=True)
    with pytest.raises(UnsupportedCheckpointError, match="DoRA"):
        plan_export(dora, ConvertOptions(), merge=True)
    missing = _lora_checkpoint(demo, tmp_path / "b", with_base=False, base_model_name_or_path="org/not-local")
    with pytest.raises(BaseModelError, match="org/not-local") as err:
        plan_export(missing, ConvertOptions(), merge=True)
    assert "--base" in err.value.hint and "never downloads" in err.value.hint
    xp = plan_export(missing, ConvertOptions(), merge=True, base=str(tmp_path / "b" / "base"))
    assert xp.merged is not None
    with pytest.raises(Exception, match="exclude each other"):
        plan_export(missing, ConvertOptions(), merge=True, adapter=True)
    plain = scan(str(demo(SPEC)))
    with pytest.raises(Exception, match="no LoRA parameters"):
        plan_export(plain, ConvertOptions(), adapter=True)


def test_scan_json_describes_the_adapter(demo: Any, tmp_path: Path) -> None:
    from inspector.scan.json_view import adapter_json, checkpoint_json

    ckpt = _lora_checkpoint(demo, tmp_path, use_rslora=True)
    info = adapter_json(ckpt)
    assert info is not None
    assert info["layers"] == 2 and info["r"] == 2 and info["lora_alpha"] == 4 and info["use_rslora"] is True
    assert info["base_model_name_or_path"] == str(tmp_path / "base") and info["merge_problems"] == []
    assert checkpoint_json(scan(str(demo(SPEC))))["adapter"] is None


def test_merged_output_shards_with_an_index(demo: Any, tmp_path: Path) -> None:
    ckpt = _lora_checkpoint(demo, tmp_path)
    xp = plan_export(ckpt, ConvertOptions(dtype="fp32", shard_size=300), merge=True)
    _write(xp, tmp_path / "out")
    index = json.loads((tmp_path / "out" / "model.safetensors.index.json").read_text())
    files = sorted(set(index["weight_map"].values()))
    assert len(files) > 1 and files == sorted(p.name for p in (tmp_path / "out").glob("model-*.safetensors"))
    got: dict[str, np.ndarray] = {}
    for f in files:
        got |= load_file(tmp_path / "out" / f)
    want = _expected(ckpt, 2.0, 2.0)
    assert set(got) == set(want) == set(index["weight_map"])
    for k, v in want.items():
        np.testing.assert_allclose(got[k], v, rtol=1e-6, atol=1e-6, err_msg=k)
    assert not list((tmp_path / "out").glob("*.partial"))


def test_adapter_with_trained_biases_keeps_peft_names(demo: Any, tmp_path: Path) -> None:
    ckpt = _lora_checkpoint(demo, tmp_path, bias="lora_only")
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


def test_cli_refusals_and_verify_of_a_merge(demo: Any, tmp_path: Path, cli: Any) -> None:
    from inspector.convert.writers.merge import is_merged_output

    root = demo(SPEC)
    rc, _, stderr = cli("convert", root, tmp_path / "a", "--adapter")
    assert rc == 2 and "no LoRA parameters" in stderr
    rc, _, stderr = cli("convert", root, tmp_path / "b", "--base", str(tmp_path))
    assert rc == 2 and "--base is only used with --merge-adapter" in stderr
    ckpt = _lora_checkpoint(demo, tmp_path)
    _write(plan_export(ckpt, ConvertOptions(), merge=True), tmp_path / "merged")
    assert is_merged_output(str(tmp_path / "merged"))
    rc, _, stderr = cli("verify", root, tmp_path / "merged")
    assert rc == 2 and "--merge-adapter" in stderr
    rc, _, stderr = cli("convert", root, tmp_path / "plain")
    assert rc == 0 and not is_merged_output(str(tmp_path / "plain"))


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

    from inspector.convert.export import _PEFT_RENAMES

    out = name
    for pattern, repl in _PEFT_RENAMES:
        out = re.sub(pattern.replace("{name}", "default"), repl, out)
    assert out == peft_key(name, "default")


def test_a_broken_adapter_config_does_not_break_scan(demo: Any, tmp_path: Path) -> None:
    from inspector.scan.json_view import adapter_json

    ckpt = _lora_checkpoint(demo, tmp_path)
    (Path(ckpt.root) / "adapter_config.json").write_text("{not json")
    info = adapter_json(ckpt)
    assert info is not None and "not readable JSON" in info["error"]


def test_verify_checks_an_adapter_folder_byte_for_byte(demo: Any, tmp_path: Path) -> None:
    """verify reads --adapter output (adapter_model.safetensors, PEFT names) through the names the export
    recorded: every adapter tensor compared, the base weights not called missing, a flipped byte caught."""
    from inspector.convert.verify import VerifyResult, run_verify

    ckpt = _lora_checkpoint(demo, tmp_path)
    out = tmp_path / "adapter"
    _write(plan_export(ckpt, ConvertOptions(), adapter=True), out)

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


def test_a_merge_takes_the_output_folder_like_every_writer(demo: Any, tmp_path: Path) -> None:
    """The merged model used to write without the folder lock: a second conversion into the same folder
    would have mixed its shards in. Now it is refused while another run holds the folder, and the folder is
    free again (no lock file left) after the merge."""
    from inspector.convert.output import LOCK, FolderLock
    from inspector.errors import OutputError

    ckpt = _lora_checkpoint(demo, tmp_path)
    xp = plan_export(ckpt, ConvertOptions(), merge=True)
    out = tmp_path / "merged"
    other = FolderLock(str(out))
    try:
        with pytest.raises(OutputError, match="Another conversion"):
            for _ in run_export(xp, str(out)):
                pass
    finally:
        other.release(ok=True)
    for _ in run_export(xp, str(out)):
        pass
    assert (out / "model.safetensors").is_file() and not (out / LOCK).exists()
