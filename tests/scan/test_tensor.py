"""Tensor-parallel checkpoints (AutoTP training, a tiny Llama, autotp_size 2) saved by real DeepSpeed 0.19.8:
shards joined by what universal_checkpoint_info records, equal bit for bit to ds_to_universal's merged fp32
and to the full 16-bit weights DeepSpeed gathers itself; what is not recorded is refused, never guessed."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import torch

from inspector.scan.model import Checkpoint
from inspector.scan.scanner import scan
from tests.scan.layout_cases import FIXTURES, HALF, ckpt_dir, convert, expected, writable

TAG = "global_step3"
CASES = {
    "tp_z1_bf16": (1, 1),
    "tp_z2_bf16": (2, 1),
    "tp_z2_bf16_dp2": (2, 2),
    "tp_phi3_z1_bf16": (1, 1),  # Phi-3: fused qkv_proj and gate_up_proj, split per sub-parameter
    "tp_z3_bf16": (3, 1),  # ZeRO-3: every shard's parameters partitioned per parameter (FORMAT.md §3.4)
    "tp_z3_fp16": (3, 1),
    "tp_z3_bf16_dp2": (3, 2),
    "tp_z3_bf16_dp3": (3, 3),  # 6 ranks: a 16-element norm over 3 ranks leaves padding on the last
}  # name -> (ZeRO stage, DP ranks)


@pytest.mark.parametrize("name", sorted(n for n in CASES if (FIXTURES / n).is_dir()))
def test_tensor_parallel_joins_bit_exact(name: str, tmp_path: Path) -> None:
    stage, dp = CASES[name]
    ckpt = scan(str(ckpt_dir(name)))
    assert not ckpt.errors, ckpt.errors
    assert ckpt.parallel is not None and (ckpt.parallel.kind, ckpt.parallel.tp, ckpt.parallel.dp) == (
        "tensor",
        2,
        dp,
    )
    assert (ckpt.stage, ckpt.world_size) == (stage, 2 * dp)
    want = expected(name)
    masters = {k[5:]: v for k, v in want.items() if k.startswith("fp32/")}  # ds_to_universal's merge
    assert ckpt.tensor("model.layers.0.mlp.down_proj.weight").shape == (16, 24)  # row-parallel: dim 1
    assert ckpt.tensor("lm_head.weight").shape == (40, 16)  # vocabulary-parallel
    fp32 = convert(ckpt, tmp_path / "fp32", "fp32")
    assert set(fp32) == set(masters) == {t.name for t in ckpt.tensors}
    for n, v in masters.items():
        assert np.array_equal(fp32[n].view(np.uint32), v.view(np.uint32)), n
        if "qkv_proj" not in n and "gate_up_proj" not in n:
            live = _live_join(want, n, v.shape, tp=2)
            assert np.array_equal(fp32[n].view(np.uint32), live.view(np.uint32)), n
    half = convert(ckpt, tmp_path / "half", "auto")
    for n, v in masters.items():
        cast = v.astype(HALF[ckpt.compute_dtype]).view(np.uint16)
        assert np.array_equal(half[n].view(np.uint16), cast), n
        assert np.array_equal(want[f"half/{n}"], cast), n  # DeepSpeed's own gather of the 16-bit weights


def _live_join(want: dict[str, np.ndarray], name: str, shape: tuple[int, ...], tp: int) -> np.ndarray:
    """The fp32 masters the engines held (`safe_get_full_fp32_param` on each global rank r, TP rank r mod tp;
    data-parallel replicas equal) put side by side the way their shapes show: a full-shape shard is a
    replica (every copy equal), else the shards stack on the dimension that is short (vocabulary rows cut to
    the full count). Fused sub-parameters are not covered."""
    ranks = {
        int(k.split("/")[1]): v for k, v in want.items() if k.startswith("shard/") and k.endswith(f"/{name}")
    }
    for r, v in ranks.items():
        assert np.array_equal(v.view(np.uint32), ranks[r % tp].view(np.uint32)), (name, r)
    shards = [ranks[t] for t in range(tp)]
    if shards[0].shape == shape:
        assert all(np.array_equal(s.view(np.uint32), shards[0].view(np.uint32)) for s in shards), name
        return shards[0]
    dim = 1 if len(shape) > 1 and shards[0].shape[1] != shape[1] else 0
    return np.concatenate(shards, axis=dim)[: shape[0]]


def _resave_model_states(root: Path, edit, name: str | None = None) -> None:  # type: ignore[no-untyped-def]
    """`edit` applied to one model-states file, or to every shard's (each carries the whole record, and the
    scan refuses shards whose records disagree)."""
    for path in [root / TAG / name] if name else sorted((root / TAG).glob("*model_states.pt")):
        sd = torch.load(path, weights_only=False)
        edit(sd)
        torch.save(sd, path)


def test_a_checkpoint_that_does_not_record_the_split_is_refused(tmp_path: Path) -> None:
    root = writable("tp_z1_bf16", tmp_path / "ck")
    _resave_model_states(root, lambda sd: sd.pop("universal_checkpoint_info"))
    ckpt = scan(str(root))
    assert [f.code for f in ckpt.errors] == ["tp-unrecorded"]
    assert "does not record how its parameters were split" in ckpt.errors[0].message
    assert not ckpt.tensors


def test_a_regex_split_rule_is_not_evaluated(tmp_path: Path) -> None:
    root = writable("tp_z1_bf16", tmp_path / "ck")

    def crafted(sd):  # type: ignore[no-untyped-def]
        sd["universal_checkpoint_info"]["parameter_with_row_parallelism_patterns"].append("^(a+)+$")

    _resave_model_states(root, crafted)
    ckpt = scan(str(root))
    assert [f.code for f in ckpt.errors] == ["tp-unrecorded"]
    assert "regular expressions" in ckpt.errors[0].message
    assert "--tp-split" in ckpt.errors[0].hint
    stated = scan(str(root), tp_split=SPLIT)  # a record only as regexes: the user's split is taken
    assert not stated.errors and stated.tensor("model.layers.0.mlp.down_proj.weight").shape == (16, 24)


def test_a_missing_shard_is_named(tmp_path: Path) -> None:
    root = writable("tp_z1_bf16", tmp_path / "ck")
    for n in os.listdir(root / TAG):
        if "mp_rank_01" in n:
            os.remove(root / TAG / n)
    ckpt = scan(str(root))
    assert any(f.code == "missing-shard" and "tensor-parallel rank 1" in f.message for f in ckpt.errors)


Z3_MODEL0 = "zero_pp_rank_0_mp_rank_00_model_states.pt"


@pytest.mark.parametrize(
    ("gone", "code", "words"),
    [
        ("zero_pp_rank_1_mp_rank_01_model_states.pt", "missing-rank", "Tensor-parallel shard 1 (mp_rank_01)"),
        ("bf16_zero_pp_rank_1_mp_rank_00_optim_states.pt", "missing-rank", "shard 0 (mp_rank_00): The optimizer"),
        ("zero_pp_rank_0_mp_rank_01_model_states.pt", "missing-shard", "zero_pp_rank_0_mp_rank_01_model_states"),
    ],
)
def test_a_missing_zero3_rank_file_is_named(gone: str, code: str, words: str, tmp_path: Path) -> None:
    """ZeRO-3 under TP: every data-parallel rank of every shard writes model and optimizer states; one gone is
    a finding that says which shard, and nothing is joined (no traceback, no half-built tensor)."""
    root = writable("tp_z3_bf16_dp2", tmp_path / "ck")
    os.remove(root / TAG / gone)
    ckpt = scan(str(root))
    assert any(f.code == code and words in f.message for f in ckpt.errors), ckpt.errors
    assert not ckpt.tensors


def test_a_zero3_checkpoint_without_its_first_model_states_is_refused(tmp_path: Path, cli) -> None:  # type: ignore[no-untyped-def]
    root = writable("tp_z3_bf16", tmp_path / "ck")
    os.remove(root / TAG / Z3_MODEL0)
    got = cli("scan", root)
    assert got.rc != 0 and f"no {Z3_MODEL0}" in got.stdout + got.stderr
    assert "Traceback" not in got.stdout + got.stderr


def test_an_unrecorded_split_under_zero3_takes_the_users(tmp_path: Path) -> None:
    """The --tp-split path is the same under ZeRO-3: refused without it, DeepSpeed's merge with it."""
    root = writable("tp_z3_bf16_dp2", tmp_path / "ck")
    _resave_model_states(root, lambda sd: sd.pop("universal_checkpoint_info"), Z3_MODEL0)
    assert [f.code for f in scan(str(root)).errors] == ["tp-unrecorded"]
    ckpt = scan(str(root), tp_split=SPLIT)
    assert not ckpt.errors
    _assert_fp32_masters(ckpt, "tp_z3_bf16_dp2", tmp_path)


def _assert_fp32_masters(ckpt: Checkpoint, name: str, tmp_path: Path) -> None:
    """The fp32 conversion holds, bit for bit, every fp32 master fixture `name` recorded (DeepSpeed's merge)."""
    masters = {k[5:]: v for k, v in expected(name).items() if k.startswith("fp32/")}
    fp32 = convert(ckpt, tmp_path / "fp32", "fp32")
    for n, v in masters.items():
        assert np.array_equal(fp32[n].view(np.uint32), v.view(np.uint32)), n


SPLIT = (
    ("*.o_proj.weight", "1"),
    ("*.down_proj.weight", "1"),
    ("*norm.weight", "replicated"),
    ("model.embed_tokens.weight", "replicated"),
    ("*", "0"),
)


def test_the_user_states_an_unrecorded_split(tmp_path: Path, cli) -> None:  # type: ignore[no-untyped-def]
    """--tp-split: every parameter matched by a glob (first match wins); the join then equals DeepSpeed's."""
    root = writable("tp_z1_bf16", tmp_path / "ck")
    _resave_model_states(root, lambda sd: sd.pop("universal_checkpoint_info"))
    partial = scan(str(root), tp_split=SPLIT[:-1])
    assert [f.code for f in partial.errors] == ["tp-unrecorded"] and "match no --tp-split" in partial.errors[
        0
    ].message
    ckpt = scan(str(root), tp_split=SPLIT)
    assert not ckpt.errors
    _assert_fp32_masters(ckpt, "tp_z1_bf16", tmp_path)
    args = [a for glob, rule in SPLIT for a in ("--tp-split", f"{glob}={rule}")]
    assert cli("convert", root, tmp_path / "out", "--format", "weights", "--dtype", "fp32", *args).rc == 0
    verified = cli("verify", root, tmp_path / "out", *args)
    assert verified.rc == 0 and "OK" in verified.stdout
    refused = cli("scan", root)
    assert refused.rc != 0 and "--tp-split" in refused.stdout + refused.stderr
    assert cli("scan", root, "--tp-split", "nodim").rc == 2


QKV = "model.layers.0.self_attn.qkv_proj.weight"
GATE_UP = "model.layers.0.mlp.gate_up_proj.weight"


def test_fused_sub_parameters_are_not_a_plain_concatenation() -> None:
    """What the Phi-3 fixture proves: each shard holds a piece of q, k and v (gate and up), so the full
    weight is not the shards stacked on dim 0; the join above equals ds_to_universal's only per sub-parameter."""
    want = expected("tp_phi3_z1_bf16")
    for name in (QKV, GATE_UP):
        stacked = np.concatenate([want[f"shard/{t}/{name}"] for t in (0, 1)])
        assert stacked.shape == want[f"fp32/{name}"].shape
        assert not np.array_equal(stacked, want[f"fp32/{name}"]), name


def _pattern(name: str) -> str:
    return "^" + name.replace(".", "\\.") + "$"


def _older_record(sd):  # type: ignore[no-untyped-def]
    """The forms DeepSpeed wrote before UCP 0.4: no widths, qkv as a count of equal sub-parameters, and
    gate_up under parameter_with_2_sub_params_cat_dim_0 (Megatron-DeepSpeed's GLU)."""
    info = sd["universal_checkpoint_info"]
    info["universal_checkpoint_version"] = 0.3
    del info["sub_param_shard_widths"], info["affine_map"]
    info["parameter_with_sub_params"] = [{"patterns": [_pattern(QKV)], "shape": [3, -1], "partition_dim": 0}]
    info["parameter_with_2_sub_params_cat_dim_0"] = [_pattern(GATE_UP)]


@pytest.mark.parametrize("edit", ["older-forms", "no-widths-at-0.4", "wrong-widths"])
def test_sub_parameter_records(edit: str, tmp_path: Path) -> None:
    """Every form of the record DeepSpeed's converter reads joins the same; one that cannot describe the
    shards (UCP 0.4 without widths, widths that do not add up) is refused naming the parameter."""
    root = writable("tp_phi3_z1_bf16", tmp_path / "ck")
    if edit != "older-forms":  # without the map, which DeepSpeed would follow ahead of the lists
        _resave_model_states(root, lambda sd: sd["universal_checkpoint_info"].pop("affine_map"))
    if edit == "older-forms":
        _resave_model_states(root, _older_record)
    elif edit == "no-widths-at-0.4":
        _resave_model_states(root, lambda sd: sd["universal_checkpoint_info"].pop("sub_param_shard_widths"))
    else:
        widths = [[9, 7], [8, 8], [8, 8]]  # q still 16 rows in all, but shard 0 would hold 25, not 24
        _resave_model_states(
            root,
            lambda sd: sd["universal_checkpoint_info"]["sub_param_shard_widths"].update(
                {_pattern(QKV): widths}
            ),
        )
    ckpt = scan(str(root))
    if edit != "older-forms":
        assert {f.code for f in ckpt.errors} == {"tp-mismatch"} and QKV not in {t.name for t in ckpt.tensors}
        qkv = next(f.message for f in ckpt.errors if QKV in f.message)
        assert ("sub_param_shard_widths" if edit == "no-widths-at-0.4" else "do not describe") in qkv
        return
    assert not ckpt.errors, ckpt.errors
    fp32 = convert(ckpt, tmp_path / "fp32", "fp32")
    for n in (QKV, GATE_UP):
        assert np.array_equal(
            fp32[n].view(np.uint32), expected("tp_phi3_z1_bf16")[f"fp32/{n}"].view(np.uint32)
        )
