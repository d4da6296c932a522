"""Universal checkpoints written from the model-parallel layout fixtures (real DeepSpeed 0.19.8 runs): every
tensor and step bit-identical to DeepSpeed's own `ds_to_universal` output (tests/fixtures/universal_layouts,
made once by its make_refs.py), the tensor-parallel keys DeepSpeed's loader splits by, native-MoE experts stacked
per local slot as DeepSpeed's loader cuts them, verify, --part and the resume of a killed run; ZeRO-off pipelines
refused with the reason DeepSpeed cannot resume them.
"""

from __future__ import annotations

import os
import pickle
import re
import shutil
import types
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from inspector.convert.kinds.base import Request, Why
from inspector.convert.kinds.universal import Universal
from inspector.convert.kinds.universal.plan import plan_universal
from inspector.convert.reader import read_tensor
from inspector.convert.root import PARTIAL
from inspector.errors import UnsupportedCheckpointError
from inspector.scan.scanner import scan
from tests.convert.jobs import universal as write_universal
from tests.convert.kinds.test_universal import as_killed
from tests.scan.layout_cases import ckpt_dir, expected

REFS = Path(__file__).resolve().parents[2] / "fixtures" / "universal_layouts"
WRITTEN = ("tp_z1_bf16", "tp_z2_bf16", "tp_z2_bf16_dp2", "pp_z1_bf16", "pp_z1_fp16", "pp_z1_bf16_dp2")
# the layouts scan/pipeline_tensor.py and the sub-parameter records added: pipeline x TP 2, AutoTP Phi-3 (fused
# qkv_proj / gate_up_proj) with its affine map, without it (UCP 0.4 widths), and as UCP 0.3 records it
NEW_LAYOUTS = ("pptp_z1_bf16", "tp_phi3_z1_bf16", "tp_phi3_z1_bf16_noaffine", "tp_phi3_z1_bf16_ucp03")
VIEWS = ("tp_experts_z1_bf16", "tp_experts_z3_bf16_dp2")  # AutoTP fused experts split along a 3-D view
ZERO3 = ("tp_z3_bf16", "tp_z3_fp16", "tp_z3_bf16_dp2", "tp_z3_bf16_dp3")  # AutoTP under ZeRO-3
ROW = {"model.layers.0.self_attn.o_proj.weight", "model.layers.0.mlp.down_proj.weight"}
REPLICATED = {
    "model.embed_tokens.weight",
    "model.layers.0.input_layernorm.weight",
    "model.layers.0.post_attention_layernorm.weight",
    "model.norm.weight",
}


def _make_refs() -> Any:
    """tests/fixtures/universal_layouts/make_refs.py: its variants' edits are applied here as there."""
    from tests.scripts import load_script

    return load_script(REFS / "make_refs.py")


def _source(config: str, tmp_path: Path) -> Path:
    """The fixture's checkpoint root (a make_refs variant: an edited copy under tmp_path)."""
    if config not in _make_refs().VARIANTS:
        return ckpt_dir(config)
    _make_refs().prepared(config, str(tmp_path / "src"))
    return tmp_path / "src"


def _reference(config: str) -> dict[str, np.ndarray]:
    with np.load(REFS / f"{config}.npz") as z:
        return {k: z[k] for k in z.files}


@dataclass
class SubparamShape:
    """DeepSpeed's `universal_checkpoint.SubparamShape` (same fields, same repr): the unit suite never imports
    deepspeed, so the files are unpickled with this in its place."""

    patterns: list[str]
    shape: Any
    partition_dim: int


class _Unpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if (module, name) == ("deepspeed.checkpoint.universal_checkpoint", "SubparamShape"):
            return SubparamShape
        return super().find_class(module, name)


_PICKLE = types.SimpleNamespace(**{**vars(pickle), "Unpickler": _Unpickler})


def _written(folder: Path) -> dict[str, Any]:
    """Every `zero/<name>/<state>.pt` as loaded by torch (the way DeepSpeed's loader reads it)."""
    out = {}
    for path in sorted((folder / "zero").glob("*/*.pt")):
        out[f"{path.stem}/{path.parent.name}"] = torch.load(path, weights_only=False, pickle_module=_PICKLE)
    return out


@pytest.mark.parametrize("config", WRITTEN + NEW_LAYOUTS + ZERO3 + VIEWS)
def test_every_tensor_key_and_step_equals_ds_to_universal(config: str, tmp_path: Path) -> None:
    """Every tensor bit for bit, and the keys beside it exactly (names, types, values: a SubparamShape
    included), as DeepSpeed's ds_to_universal wrote them for the same checkpoint."""
    ckpt = scan(str(_source(config, tmp_path)))
    assert Universal().offer(ckpt).available
    plan = plan_universal(ckpt, str(tmp_path / "out"))
    write_universal(plan)
    got, want = _written(Path(plan.out_dir)), _reference(config)
    meta_repr = _make_refs().meta_repr
    assert sorted(got) == sorted(k for k in want if not k.startswith("meta/"))  # nothing else written
    for key, ref in want.items():
        if key.startswith("meta/"):
            assert meta_repr(got[key[len("meta/") :]]) == str(ref), key
        elif key.startswith("step/"):
            assert float(got[key]) == float(ref), key
        else:
            mine = got[key]["param"]
            assert mine.dtype == torch.float32 and tuple(mine.shape) == ref.shape, key
            assert np.array_equal(mine.numpy().view(np.uint32), ref.view(np.uint32)), key
    assert (tmp_path / "out" / "latest_universal").read_text() == plan.folder
    copies = sorted(p.name for p in Path(plan.out_dir).iterdir() if p.is_file())
    assert copies == sorted(os.path.basename(f.path) for f in ckpt.files if f.role == "model")
    if "_z3_" in config:  # as ds_to_universal: every data-parallel rank's model states of every shard
        dp = int(config[-1]) if "_dp" in config else 1
        assert copies == [f"zero_pp_rank_{d}_mp_rank_0{t}_model_states.pt" for d in range(dp) for t in (0, 1)]
    else:
        assert copies[:2] == ["mp_rank_00_model_states.pt", "mp_rank_01_model_states.pt"]  # as ds_to_universal


def _keys(value: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in value.items() if k != "param"}


def test_a_record_without_an_affine_map_gives_the_keys_deepspeeds_loader_splits_by(tmp_path: Path) -> None:
    """Row-parallel shards sat side by side (cat_dim 1), replicated ones carry no cat_dim (DeepSpeed's loader
    then takes the whole tensor), fused sub-parameters their recorded SubparamShape; the rest joined on dim 0.
    (AutoTP's affine map, where recorded, supersedes these: DeepSpeed writes no keys for what it covers.)"""
    ckpt = scan(str(_source("tp_phi3_z1_bf16_noaffine", tmp_path)))
    plan = plan_universal(ckpt, str(tmp_path / "out"))
    write_universal(plan)
    for key, value in _written(Path(plan.out_dir)).items():
        state, name = key.split("/", 1)
        if state == "step":
            continue
        if name in ROW:
            assert _keys(value) == {"cat_dim": 1}, key
        elif name in REPLICATED or name == "lm_head.weight":
            assert _keys(value) == {}, key
        else:
            sub = value["sub_param_shape"]
            assert set(value) == {"param", "sub_param_shape"} and sub.partition_dim == 0, key
            assert sub.shape[0] == ((16, 16, 16) if "qkv" in name else (24, 24)), key


def test_a_pipeline_with_tensor_parallel_layers_is_split_by_its_record(tmp_path: Path) -> None:
    """Pipeline x TP 2 (kind "pipeline"): the record's row-parallel weight gets cat_dim 1, its replicated
    parameters none, the column-parallel layer cat_dim 0 (before: cat_dim 0 for every one)."""
    plan = plan_universal(scan(str(ckpt_dir("pptp_z1_bf16"))), str(tmp_path))
    write_universal(plan)
    got = {k: _keys(v) for k, v in _written(Path(plan.out_dir)).items() if not k.startswith("step/")}
    assert got["fp32/3.weight"] == {"cat_dim": 1} and got["exp_avg_sq/1.weight"] == {"cat_dim": 0}
    assert all(got[f"{s}/{n}"] == {} for s in ("fp32", "exp_avg") for n in ("0.weight", "3.bias", "5.weight"))


@pytest.mark.parametrize(
    ("config", "model0"),
    [("tp_z1_bf16", "mp_rank_00_model_states.pt"), ("tp_z3_bf16_dp2", "zero_pp_rank_0_mp_rank_00_model_states.pt")],
)
def test_a_split_stated_with_tp_split_writes_the_same_keys(config: str, model0: str, tmp_path: Path) -> None:
    """Without universal_checkpoint_info the user states the split; the keys come from the rules stated."""
    from tests.scan.test_tensor import SPLIT, _resave_model_states

    root = tmp_path / "ck"
    shutil.copytree(ckpt_dir(config), root)
    _resave_model_states(root, lambda sd: sd.pop("universal_checkpoint_info"), model0)
    plan = plan_universal(scan(str(root), tp_split=SPLIT), str(tmp_path / "out"))
    write_universal(plan)
    written = _written(Path(plan.out_dir))
    assert _keys(written["fp32/model.layers.0.mlp.down_proj.weight"]) == {"cat_dim": 1}
    assert set(written["fp32/model.norm.weight"]) == {"param"}
    ref = _reference(config)
    assert all(np.array_equal(v["param"].numpy(), ref[k]) for k, v in written.items() if "step/" not in k)


MOE = {  # fixture -> {layer prefix: (experts, expert-parallel size)}; the largest size is 2 in each
    "moe_z2_bf16": {"moe": (4, 2)},
    "moe_z2_fp16": {"moe": (4, 2)},
    "moe_z1_bf16": {"moe": (4, 2), "moe2": (2, 1)},
    "moe_z2_bf16_ws4": {"moe": (4, 2), "moe2": (2, 1)},
}


@pytest.mark.parametrize("config", sorted(MOE))
def test_native_moe_experts_are_stacked_per_local_slot(config: str, tmp_path: Path, cli: Any) -> None:
    """DeepSpeed's loader reads an expert under its local name and takes block r of a stacked file on
    expert-parallel rank r: slot j's entry r is global expert (r mod ep) * n_local + j (the live fp32 master
    make_moe.py recorded under its global name; the moments read from the source checkpoint)."""
    ckpt = scan(str(ckpt_dir(config)))
    assert Universal().offer(ckpt).available
    plan = plan_universal(ckpt, str(tmp_path / "out"))
    write_universal(plan)
    got = _written(Path(plan.out_dir))
    live = expected(config)
    stacked = 0
    for key, value in got.items():
        state, name = key.split("/", 1)
        m = re.match(r"(\w+)\.deepspeed_moe\.experts\.deepspeed_experts\.(\d+)(\..+)$", name)
        if state == "step" or m is None:
            continue
        experts, ep = MOE[config][m.group(1)]
        local, j = experts // ep, int(m.group(2))
        assert j < local and value["is_expert_param"] is True and value["ep_num_experts"] == 2, key
        assert value["param"].shape[0] == 2
        for r in range(2):
            glob = f"{m.group(1)}.deepspeed_moe.experts.deepspeed_experts.{(r % ep) * local + j}{m.group(3)}"
            want = live[f"fp32/{glob}"] if state == "fp32" else _f32(read_tensor(ckpt, glob, state))
            assert np.array_equal(value["param"][r].numpy().view(np.uint32), want.view(np.uint32)), (key, r)
        stacked += 1
    assert stacked == 3 * 4 * sum(e // ep for e, ep in MOE[config].values())  # states x params x slots
    assert float(got["step/head.weight"]) == ckpt.optimizer_step
    res = cli("verify", ckpt_dir(config), tmp_path / "out")
    assert res.rc == 0, res.output


def _f32(x: Any) -> np.ndarray:
    return x.float().numpy() if isinstance(x, torch.Tensor) else np.asarray(x, dtype=np.float32)


def test_a_pipeline_with_zero_off_is_refused_with_deepspeeds_reason(tmp_path: Path, cli: Any) -> None:
    ckpt = scan(str(ckpt_dir("pp_z0_bf16")))
    offer = Universal().offer(ckpt)
    assert not offer.available and offer.why is Why.NOT_RESUMABLE
    assert "never reads a universal checkpoint's zero/ folder at stage 0" in offer.reason
    with pytest.raises(UnsupportedCheckpointError, match="KeyError: 0") as err:
        Universal().plan(ckpt, Request(), str(tmp_path / "out"))
    assert "DeepSpeed 0.19.8" in err.value.message
    res = cli("convert", ckpt_dir("pp_z0_bf16"), tmp_path / "cli", "--format", "universal")
    assert (
        res.rc == 2 and "DeepSpeed cannot resume this layout" in res.output and "Traceback" not in res.output
    )
    assert not (tmp_path / "cli").exists() or not any((tmp_path / "cli").iterdir())


@pytest.mark.parametrize("config", ["tp_z2_bf16_dp2", "pp_z1_bf16_dp2", "moe_z2_bf16_ws4", "tp_z3_bf16_dp2"])
def test_verify_parts_and_a_killed_run_work_as_for_any_checkpoint(
    config: str, tmp_path: Path, cli: Any
) -> None:
    root = ckpt_dir(config)
    one, out = tmp_path / "one", tmp_path / "out"
    assert cli("convert", root, one, "--format", "universal").rc == 0
    res = cli("verify", root, one)
    assert res.rc == 0 and "universal" in res.output, res.output
    for i in range(2):
        assert cli("convert", root, out, "--format", "universal", "--part", f"{i}/2").rc == 0
    res = cli("convert", root, out, "--format", "universal")
    assert res.rc == 0 and "reused (written by --part runs" in res.output, res.output
    assert _tree(out) == _tree(one)
    # a run killed after some files: the rerun keeps them and writes the rest
    plan = plan_universal(scan(str(root)), str(tmp_path / "killed"))
    write_universal(plan)
    staging = Path(plan.out_dir + PARTIAL)
    os.rename(plan.out_dir, staging)
    os.remove(tmp_path / "killed" / "latest_universal")
    os.remove(staging / plan.files[0].rel)
    as_killed(plan, staging)
    report = write_universal(plan)
    assert report.resumed_shards == len(plan.files) + len(plan.copies) - 1
    assert _tree(tmp_path / "killed") == _tree(one)


def test_verify_names_a_changed_moment_of_a_joined_parameter(tmp_path: Path, cli: Any) -> None:
    root = ckpt_dir("tp_z1_bf16")
    out = tmp_path / "out"
    assert cli("convert", root, out, "--format", "universal").rc == 0
    path = out / "global_step3_uni" / "zero" / "model.layers.0.mlp.down_proj.weight" / "exp_avg_sq.pt"
    value = torch.load(path, weights_only=False)
    value["param"][3, 17] += 1.0  # a column of shard 1: where the dim-1 join places it
    torch.save(value, path)
    res = cli("verify", root, out)
    assert res.rc == 1 and "down_proj.weight/exp_avg_sq" in res.output, res.output


def _tree(folder: Path) -> dict[str, bytes]:
    skip = (".zero-inspector",)
    return {
        str(p.relative_to(folder)): p.read_bytes()
        for p in sorted(folder.rglob("*"))
        if p.is_file() and not p.name.startswith(skip)
    }


def test_an_expert_layout_deepspeeds_loader_cannot_cut_is_refused_not_guessed(tmp_path: Path) -> None:
    """DeepSpeed's loader cuts every expert file by the largest expert-parallel size: a layer whose size does
    not divide it, or whose experts do not split over it, is refused with the reason (no traceback)."""
    from dataclasses import replace

    ckpt = scan(str(ckpt_dir("moe_z1_bf16")))
    odd = tuple(
        replace(g, hyperparams={**g.hyperparams, "name": "ep_size_3"})
        if g.hyperparams.get("name") == "ep_size_1"
        else g
        for g in ckpt.groups
    )
    with pytest.raises(UnsupportedCheckpointError, match="does not divide the largest"):
        plan_universal(replace(ckpt, groups=odd), str(tmp_path))
    three = tuple(
        t for t in ckpt.tensors if ".deepspeed_experts.3." not in t.name
    )  # layer moe: 3 of 4 experts
    with pytest.raises(UnsupportedCheckpointError, match="do not split over expert-parallel size 2"):
        plan_universal(replace(ckpt, tensors=three), str(tmp_path))


@pytest.mark.parametrize("config", ["pptp_z1_bf16", "tp_phi3_z1_bf16", "tp_phi3_z1_bf16_noaffine", "tp_z3_bf16_dp2"])
def test_verify_checks_the_tensor_parallel_keys_too(config: str, tmp_path: Path, cli: Any) -> None:
    """Every byte right and a row-parallel weight's cat_dim wrong resumes that weight wrong (the pptp interop
    case showed it): verify names the file. A SubparamShape read back compares equal to the record's."""
    root, out = _source(config, tmp_path), tmp_path / "out"
    assert cli("convert", root, out, "--format", "universal").rc == 0
    res = cli("verify", root, out)
    assert res.rc == 0, res.output
    name = "3.weight" if config.startswith("pptp") else "model.layers.0.mlp.down_proj.weight"
    path = out / "global_step3_uni" / "zero" / name / "exp_avg.pt"
    value = torch.load(path, weights_only=False)
    value["cat_dim"] = 0
    torch.save(value, path)
    res = cli("verify", root, out)
    assert res.rc == 1 and f"{name}/exp_avg (its tensor-parallel keys" in res.output, res.output


@pytest.mark.parametrize("config", ["moe_z0_bf16", "moe_z0_fp16", "moe_z0_bf16_ws4", "moe_z0_bf16_ep21"])
def test_native_moe_with_zero_off_is_refused_with_deepspeeds_reason(
    config: str, tmp_path: Path, cli: Any
) -> None:
    """DeepSpeed's stage-0 MoE loader opens the expert-parallel ranks' ZeRO-off optimizer files in the universal
    folder, never zero/ (the interop test shows its FileNotFoundError): refused as not resumable, nothing
    written."""
    ckpt = scan(str(ckpt_dir(config)))
    offer = Universal().offer(ckpt)
    assert not offer.available and offer.why is Why.NOT_RESUMABLE
    assert offer.reason.startswith("an expert-parallel checkpoint with ZeRO off (FP16_UnfusedOptimizer")
    assert "expp_rank_R_mp_rank_00_optim_states.pt" in offer.reason
    res = cli("convert", ckpt_dir(config), tmp_path / "cli", "--format", "universal")
    assert (
        res.rc == 2 and "DeepSpeed cannot resume this layout" in res.output and "Traceback" not in res.output
    )
    assert not (tmp_path / "cli").exists() or not any((tmp_path / "cli").iterdir())


@pytest.mark.parametrize(
    ("edit", "words"),
    [
        (lambda m: m.update(version=2), "affine map is of format version 2"),
        (lambda m: m["params"].update({"o_.*": {}}), "names parameters by 1 regular expression(s)"),
    ],
)
def test_an_affine_map_that_cannot_be_read_is_refused(edit: Any, words: str, tmp_path: Path, cli: Any) -> None:
    """DeepSpeed joins what an affine map covers by the map, ahead of the category lists: one DeepSpeed 0.19.8
    cannot read, or whose patterns are not plain names, leaves every parameter's layout unknown, so the scan
    refuses (an error finding naming why) and no format is written (a non-zero exit, no traceback)."""
    from tests.scan.test_tensor import _resave_model_states

    root = tmp_path / "ck"
    shutil.copytree(ckpt_dir("tp_phi3_z1_bf16"), root)
    _resave_model_states(root, lambda sd: edit(sd["universal_checkpoint_info"]["affine_map"]))
    ckpt = scan(str(root))
    assert [f.code for f in ckpt.errors] == ["tp-unreadable"] and words in ckpt.errors[0].message
    for form in ("universal", "weights"):
        res = cli("convert", root, tmp_path / form, "--format", form)
        assert res.rc != 0 and "Traceback" not in res.output and "error finding" in res.output, res.output
