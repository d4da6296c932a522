"""Pipeline-parallel checkpoints (PipelineModule, 2 stages) saved by real DeepSpeed 0.19.8: scanned, converted
bit-exact to fp32 and the training dtype, verified; damaged and crafted folders refused or reported."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from inspector.format.torchzip import load_tree
from inspector.parse.states import OptimStates
from inspector.scan.model import Kind, Severity
from inspector.scan.scanner import scan
from tests.scan.layout_cases import assert_exact, ckpt_dir, flip_bit, scan_without, writable

TAG = "global_step3"
EXACT = {  # fixture -> (data-parallel ranks per stage, optimizer, compute dtype)
    "pp_z1_bf16": (1, "DeepSpeedZeroOptimizer", "bfloat16"),
    "pp_z1_fp16": (1, "DeepSpeedZeroOptimizer", "float16"),
    "pp_z0_bf16": (1, "BF16_Optimizer", "bfloat16"),
    "pp_z1_bf16_dp2": (2, "DeepSpeedZeroOptimizer", "bfloat16"),
}


@pytest.mark.parametrize("name", sorted(EXACT))
def test_pipeline_converts_bit_exact(name: str, tmp_path: Path) -> None:
    dp, optimizer, compute = EXACT[name]
    ckpt = scan(str(ckpt_dir(name)))
    assert not ckpt.errors, ckpt.errors
    assert ckpt.parallel is not None and ckpt.parallel.kind == "pipeline"
    assert (ckpt.parallel.pp, ckpt.parallel.dp, ckpt.world_size) == (2, dp, 2 * dp)
    assert (ckpt.optimizer, ckpt.compute_dtype) == (optimizer, compute)
    holders = dict(ckpt.parallel.holders)
    assert holders["stage 0"].startswith("layers 1-2 · tied embed")
    assert holders["stage 1"].startswith("layer 4 · tied embed")  # layer 3 is a function, 5 the tied head
    names = [t.name for t in ckpt.tensors]
    assert names == [
        "tied_modules.embed.weight",
        "1.weight",
        "1.bias",
        "2.scale",
        "2.norm.weight",
        "2.norm.bias",
        "4.weight",
        "4.bias",
    ]
    assert ckpt.tensor("2.scale").kind is Kind.BUFFER
    assert all(t.module_copy for t in ckpt.tensors if t.kind is Kind.TRAINABLE)  # from the layer files
    assert_exact(ckpt, name, tmp_path)


def _stage1_optim(root: Path) -> str:
    return next(str(p) for p in (root / TAG).iterdir() if p.name.endswith("mp_rank_01_optim_states.pt"))


def test_a_tied_weight_that_differs_between_stages_is_an_error(tmp_path: Path) -> None:
    root = writable("pp_z1_bf16", tmp_path / "ck")
    path = _stage1_optim(root)
    master = OptimStates.parse(load_tree(path), path, False).groups[0].master  # tied weight comes first
    flip_bit(path, master.offset)
    ckpt = scan(str(root))
    assert [f.code for f in ckpt.errors] == ["tied-differ"]
    assert "tied_modules.embed.weight" in ckpt.errors[0].message


def test_a_missing_stage_or_rank_file_is_named(tmp_path: Path) -> None:
    root = writable("pp_z1_bf16_dp2", tmp_path / "ck")
    os.remove(root / TAG / "bf16_zero_pp_rank_1_mp_rank_01_optim_states.pt")
    ckpt = scan(str(root))
    assert any(f.code == "missing-rank" and "stage 1, data-parallel rank 1" in f.message for f in ckpt.errors)
    assert not any(t.name.startswith("4.") and t.kind is Kind.FROZEN for t in ckpt.tensors)
    os.remove(root / TAG / "mp_rank_01_model_states.pt")
    ckpt = scan(str(root))
    assert {"missing-stage"} <= {f.code for f in ckpt.errors}
    assert any("stage 1" in f.message for f in ckpt.errors if f.code == "missing-stage")


def test_a_stage_number_beyond_the_files_present_is_refused(tmp_path: Path) -> None:
    """A stage file numbered past the recorded pipeline belongs to no stage: a stray-file error, never read
    (nor a billion stages expected), and the stage it replaced is missing."""
    root = writable("pp_z1_bf16", tmp_path / "ck")
    os.rename(root / TAG / "mp_rank_01_model_states.pt", root / TAG / "mp_rank_4000000000_model_states.pt")
    ckpt = scan(str(root))
    stray = [f for f in ckpt.errors if f.code == "stray-file"]
    assert len(stray) == 1 and "mp_rank_4000000000_model_states.pt" in stray[0].message
    assert "model-parallel rank is 4000000000, but the run has 2" in stray[0].message
    assert any(f.code == "missing-stage" and "stage 1" in f.message for f in ckpt.errors)


def test_a_crafted_layer_file_name_is_refused(tmp_path: Path) -> None:
    """Keys of a layer file become tensor names: they pass the one name rule."""
    import pickle
    import zipfile

    root = writable("pp_z1_bf16", tmp_path / "ck")
    path = root / TAG / "layer_01-model_states.pt"
    with zipfile.ZipFile(path) as z:
        data = {n: z.read(n) for n in z.namelist()}
    pkl = next(n for n in data if n.endswith("data.pkl"))
    data[pkl] = data[pkl].replace(b"bias", b"b\x1bas")
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as z:
        for n, b in data.items():
            z.writestr(n, b)
    del pickle
    ckpt = scan(str(root))
    assert any(f.code == "unreadable" and f.file == str(path) for f in ckpt.findings)
    assert all("\x1b" not in t.name for t in ckpt.tensors)
    assert all(f.severity is not Severity.INFO or "\x1b" not in f.message for f in ckpt.findings)


def test_a_missing_layer_file_is_named(tmp_path: Path) -> None:
    """Layer 2's file holds its 16-bit weights and its buffer alone: without it the scan says so (before, only
    a warning about the buffer told, and a frozen parameter of that layer would have vanished unnoticed)."""
    ckpt = scan_without("pp_z1_bf16", tmp_path, "layer_02-model_states.pt")
    assert [f.code for f in ckpt.errors] == ["missing-layer"]
    assert "layer 2 (layer_02-model_states.pt)" in ckpt.errors[0].message


def test_a_pipeline_with_layer_files_past_99_converts_bit_exact(tmp_path: Path) -> None:
    """105 layers (100 LayerNorms after the embedding, make_pipe.py --deep 100): DeepSpeed's `layer_{:02d}`
    writes `layer_100-model_states.pt` .. `layer_104-…`; each is read by its global index, in number order."""
    names = os.listdir(ckpt_dir("pp_z1_bf16_deep") / TAG)
    assert {"layer_99-model_states.pt", "layer_100-model_states.pt", "layer_104-model_states.pt"} <= set(
        names
    )
    assert sum(n.startswith("layer_") for n in names) == 104  # every layer but the function (103)
    ckpt = scan(str(ckpt_dir("pp_z1_bf16_deep")))
    assert not ckpt.errors, ckpt.errors
    assert ckpt.parallel is not None and (ckpt.parallel.pp, ckpt.world_size) == (2, 2)
    holders = dict(ckpt.parallel.holders)
    assert holders["stage 0"].startswith("layers 1-52 · tied embed")
    assert holders["stage 1"].startswith("layers 53-102, 104 · tied embed")
    names = [t.name for t in ckpt.tensors]
    assert names[:3] == ["tied_modules.embed.weight", "1.weight", "1.bias"]
    tail = ["100.bias", "101.weight", "101.bias", "102.scale", "102.norm.weight", "102.norm.bias", "104.weight"]
    assert names[-8:] == [*tail, "104.bias"]
    assert all(t.module_copy for t in ckpt.tensors if t.kind is Kind.TRAINABLE)
    assert_exact(ckpt, "pp_z1_bf16_deep", tmp_path)
