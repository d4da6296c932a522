"""Native MoE checkpoints (deepspeed.moe.layer.MoE, ZeRO-1/2) saved by real DeepSpeed 0.19.8: experts under
their global index, groups matched by name on each rank, converted bit-exact and verified."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from inspector.errors import InputError
from inspector.format.torchzip import load_tree
from inspector.parse.states import OptimStates
from inspector.scan.model import Kind
from inspector.scan.scanner import scan
from tests.scan.layout_cases import (
    assert_exact,
    ckpt_dir,
    convert,
    expected,
    flip_bit,
    scan_without,
    writable,
)

TAG = "global_step3"
EXPERTS = "moe.deepspeed_moe.experts.deepspeed_experts"
EXACT = {  # fixture -> (ranks, ZeRO stage, compute dtype, who holds the first layer's experts)
    "moe_z2_bf16": (2, 2, "bfloat16", "experts 0-1: rank 0 · experts 2-3: rank 1"),
    "moe_z2_fp16": (2, 2, "float16", "experts 0-1: rank 0 · experts 2-3: rank 1"),
    "moe_z1_bf16": (2, 1, "bfloat16", "experts 0-1: rank 0 · experts 2-3: rank 1"),
    "moe_z2_bf16_ws4": (4, 2, "bfloat16", "experts 0-1: ranks 0, 2 · experts 2-3: ranks 1, 3"),
    "moe_z0_bf16": (2, 0, "bfloat16", "experts 0-1: rank 0 · experts 2-3: rank 1"),  # expp_rank_* files
    "moe_z0_fp16": (2, 0, "float16", "experts 0-1: rank 0 · experts 2-3: rank 1"),
    "moe_z0_fp16_fused": (2, 0, "float16", "experts 0-1: rank 0 · experts 2-3: rank 1"),  # flat groups
    "moe_z0_bf16_ws4": (4, 0, "bfloat16", "experts 0-1: ranks 0, 2 · experts 2-3: ranks 1, 3"),  # expert-DP 2
    "moe_z0_bf16_ep21": (2, 0, "bfloat16", "experts 0-1: rank 0 · experts 2-3: rank 1"),  # + a layer at ep 1
    "moe_z0_bf16_ep21_ws4": (4, 0, "bfloat16", "experts 0-1: ranks 0, 2 · experts 2-3: ranks 1, 3"),
}
SECOND = {  # fixtures with a second MoE layer at ep_size 1 -> who holds its 2 experts
    "moe_z1_bf16": "experts 0-1: ranks 0, 1",
    "moe_z2_bf16_ws4": "experts 0-1: ranks 0, 1, 2, 3",
    "moe_z0_bf16_ep21": "experts 0-1: ranks 0, 1",
    "moe_z0_bf16_ep21_ws4": "experts 0-1: ranks 0, 1, 2, 3",
}


@pytest.mark.parametrize("name", sorted(EXACT))
def test_moe_converts_bit_exact(name: str, tmp_path: Path) -> None:
    ranks, stage, compute, holders = EXACT[name]
    ckpt = scan(str(ckpt_dir(name)))
    assert not ckpt.errors, ckpt.errors
    assert ckpt.parallel is not None and (ckpt.parallel.kind, ckpt.parallel.ep) == ("expert", 2)
    assert (ckpt.world_size, ckpt.stage, ckpt.compute_dtype) == (ranks, stage, compute)
    assert dict(ckpt.parallel.holders)[EXPERTS] == holders
    if name in SECOND:
        assert dict(ckpt.parallel.holders)["moe2" + EXPERTS[3:]] == SECOND[name]
    want = {k[5:] for k in expected(name) if k.startswith("fp32/")}
    assert {t.name for t in ckpt.tensors} == want
    assert {f"{EXPERTS}.{e}.0.weight" for e in range(4)} <= want  # global expert ids
    assert all(t.module_copy for t in ckpt.tensors if t.kind is Kind.TRAINABLE)  # expert files included
    assert_exact(ckpt, name, tmp_path)


def _group_names(path: Path) -> list[str]:
    st = OptimStates.parse(load_tree(str(path)), str(path), False)
    return [str(g.hyperparams.get("name")) for g in st.groups]


@pytest.mark.parametrize("name", ["moe_z1_bf16", "moe_z2_bf16_ws4"])
def test_the_fixture_lists_expert_groups_in_another_order_on_another_rank(name: str) -> None:
    """DeepSpeed builds the MoE groups from a set: these fixtures were saved with PYTHONHASHSEED differing per
    rank, so rank 1 lists them in another order than rank 0, and a positional match would swap them."""
    folder = ckpt_dir(name) / TAG
    r0, r1 = (_group_names(folder / f"bf16_zero_pp_rank_{r}_mp_rank_00_optim_states.pt") for r in (0, 1))
    assert sorted(r0) == sorted(r1) and r0 != r1


def test_a_missing_expert_file_is_named(tmp_path: Path) -> None:
    ckpt = scan_without("moe_z2_bf16", tmp_path, "layer_0_expert_3_mp_rank_00_model_states.pt")
    assert [f.code for f in ckpt.errors] == ["missing-expert"]
    assert "expert 3 of MoE layer 0" in ckpt.errors[0].message


def test_a_missing_rank_file_is_named(tmp_path: Path) -> None:
    ckpt = scan_without("moe_z2_bf16_ws4", tmp_path, "bf16_zero_pp_rank_3_mp_rank_00_optim_states.pt")
    assert any(f.code == "missing-rank" and "rank 3" in f.message for f in ckpt.errors)
    assert not [t for t in ckpt.tensors if t.kind is Kind.TRAINABLE]


def _resave(path: Path, edit) -> None:  # type: ignore[no-untyped-def]
    import torch

    sd = torch.load(path, weights_only=False)
    torch.save(edit(sd), path)


def test_a_crafted_expert_count_costs_nothing_and_is_reported(tmp_path: Path) -> None:
    """`num_experts` is bounded by the files present: 120,000 experts are one finding, not 120,000; a count
    beyond any run refuses the (essential) model-states file as a whole."""
    root = writable("moe_z2_bf16", tmp_path / "ck")
    model = root / TAG / "mp_rank_00_model_states.pt"
    _resave(model, lambda sd: {**sd, "num_experts": [60_000, 60_000]})
    ckpt = scan(str(root))
    assert len(ckpt.errors) == 1 and "list 120,000 experts" in ckpt.errors[0].message
    _resave(model, lambda sd: {**sd, "num_experts": [10**9]})
    with pytest.raises(InputError, match=r"num_experts\[0\]: is larger than"):
        scan(str(root))


def test_an_expert_file_that_is_not_a_state_dict_is_named(tmp_path: Path) -> None:
    root = writable("moe_z2_bf16", tmp_path / "ck")
    path = root / TAG / "layer_0_expert_2_mp_rank_00_model_states.pt"
    _resave(path, lambda sd: {**sd, "moe.deepspeed_moe.experts.deepspeed_experts.2.0.weight": 3})
    ckpt = scan(str(root))
    assert [(f.code, f.file) for f in ckpt.errors] == [("unreadable", str(path))]


def test_zero_off_masters_are_unnamed_per_parameter_tensors() -> None:
    """What makes the ZeRO-off layout its own: DeepSpeed writes FP16_UnfusedOptimizer's per-parameter masters
    (in bf16 too) in expp_rank_E files, and every trainable tensor is read from them, not from a flat group."""
    folder = ckpt_dir("moe_z0_bf16") / TAG
    assert sorted(p.name for p in folder.glob("expp_rank_*")) == [
        "expp_rank_0_mp_rank_00_optim_states.pt",
        "expp_rank_1_mp_rank_00_optim_states.pt",
    ]
    ckpt = scan(str(ckpt_dir("moe_z0_bf16")))
    assert ckpt.optimizer == "FP16_UnfusedOptimizer"
    held = {t.name: os.path.basename(t.segments[0].file) for t in ckpt.tensors}
    assert held[f"{EXPERTS}.3.2.bias"] == "expp_rank_1_mp_rank_00_optim_states.pt"
    assert held["head.weight"] == "expp_rank_0_mp_rank_00_optim_states.pt"
    assert all(t.moments and t.module_copy for t in ckpt.tensors)


def _swap_masters(sd: dict, a: int, b: int) -> dict:  # type: ignore[type-arg]
    group = sd["optimizer"]["fp32_groups"][1]
    group[a], group[b] = group[b], group[a]
    return sd


def test_zero_off_masters_in_another_order_are_refused_not_misnamed(tmp_path: Path) -> None:
    """The masters carry no names: two same-shaped experts' masters swapped keep every shape in order, so only
    the 16-bit copies can tell; the scan refuses rather than write expert 2's weights under expert 3's name."""
    root = writable("moe_z0_bf16", tmp_path / "ck")
    _resave(root / TAG / "expp_rank_1_mp_rank_00_optim_states.pt", lambda sd: _swap_masters(sd, 0, 4))
    ckpt = scan(str(root))
    assert [f.code for f in ckpt.errors] == ["unnamed-params"]
    assert f"{EXPERTS}.2.0.weight" in ckpt.errors[0].message
    assert not [t for t in ckpt.tensors if t.kind is Kind.TRAINABLE]


def test_zero_off_missing_expert_rank_and_expert_file_are_named(tmp_path: Path) -> None:
    ckpt = scan_without(
        "moe_z0_fp16",
        tmp_path,
        "expp_rank_1_mp_rank_00_optim_states.pt",
        "layer_0_expert_0_mp_rank_00_model_states.pt",
    )
    assert sorted(f.code for f in ckpt.errors) == ["missing-expert", "missing-rank"]
    assert any("expert-parallel rank 1" in f.message for f in ckpt.errors)
    assert not [t for t in ckpt.tensors if t.kind is Kind.TRAINABLE]


def test_zero_off_dense_replicas_that_differ_are_an_error(tmp_path: Path) -> None:
    """Each expp_rank file holds the dense masters too; the output reads rank 0's, so rank 1's copy is
    compared and a damaged one reported."""
    root = writable("moe_z0_bf16", tmp_path / "ck")
    path = root / TAG / "expp_rank_1_mp_rank_00_optim_states.pt"
    from inspector.parse.zero_off import UnfusedFp16

    parsed = UnfusedFp16.parse(load_tree(str(path)), str(path))
    assert parsed is not None
    head = parsed.groups[0][2].master  # head.weight's master on rank 1
    flip_bit(path, head.offset)
    ckpt = scan(str(root))
    assert [(f.code, f.file) for f in ckpt.errors] == [("replica-differ", str(path))]
    assert "head.weight" in ckpt.errors[0].message


def test_zero_off_a_crafted_expert_parallel_size_costs_one_finding(tmp_path: Path) -> None:
    root = writable("moe_z0_bf16", tmp_path / "ck")

    def crafted(sd):  # type: ignore[no-untyped-def]
        sd["optimizer"]["optimizer_state_dict"]["param_groups"][1]["name"] = "ep_size_1000000"
        return sd

    for e in (0, 1):
        _resave(root / TAG / f"expp_rank_{e}_mp_rank_00_optim_states.pt", crafted)
    ckpt = scan(str(root))
    assert [f.code for f in ckpt.errors] == ["world-size"] and "ep_size_1,000,000" in ckpt.errors[0].message


def _expp_group_names(path: Path) -> list[str]:
    from inspector.parse.zero_off import UnfusedFp16

    parsed = UnfusedFp16.parse(load_tree(str(path)), str(path))
    assert parsed is not None
    return [str(h.get("name")) for h in parsed.hyperparams]


@pytest.mark.parametrize("name", ["moe_z0_bf16_ep21", "moe_z0_bf16_ep21_ws4"])
def test_zero_off_with_two_expert_parallel_sizes_is_the_layout_the_fixture_claims(name: str) -> None:
    """Two sizes without ZeRO: each expp_rank file has an ep_size_2 and an ep_size_1 group of the same length
    and shapes (MoE layer 0: 4 experts / 2, layer 1: 2 experts / 1), listed in another order on rank 1 (saved
    with PYTHONHASHSEED differing per rank): neither position nor shape says which layer each group holds."""
    folder = ckpt_dir(name) / TAG
    assert sorted(p.name for p in folder.glob("expp_rank_*")) == [
        "expp_rank_0_mp_rank_00_optim_states.pt",
        "expp_rank_1_mp_rank_00_optim_states.pt",
    ]
    r0, r1 = (_expp_group_names(folder / f"expp_rank_{e}_mp_rank_00_optim_states.pt") for e in (0, 1))
    assert sorted(r0) == sorted(r1) == ["dense", "ep_size_1", "ep_size_2"] and r0 != r1


def _rename_expert_groups(sd: dict) -> dict:  # type: ignore[type-arg]
    for g in sd["optimizer"]["optimizer_state_dict"]["param_groups"]:
        g["name"] = {"ep_size_1": "ep_size_2", "ep_size_2": "ep_size_1"}.get(g["name"], g["name"])
    return sd


def test_zero_off_expert_groups_under_each_others_size_are_refused_not_misnamed(tmp_path: Path) -> None:
    """The two groups' names swapped in every file: each group's shapes still fit a layer in order, so only
    the values can tell; the scan refuses rather than name layer 1's experts as layer 0's."""
    root = writable("moe_z0_bf16_ep21", tmp_path / "ck")
    for e in (0, 1):
        _resave(root / TAG / f"expp_rank_{e}_mp_rank_00_optim_states.pt", _rename_expert_groups)
    ckpt = scan(str(root))
    assert [f.code for f in ckpt.errors] == ["unnamed-params"]
    assert "is not what its 16-bit copy holds" in ckpt.errors[0].message
    assert not [t for t in ckpt.tensors if t.kind is Kind.TRAINABLE]


def test_moe_with_expert_tensor_parallelism_is_read_bit_exact_once_the_split_is_said(tmp_path: Path) -> None:
    """MoE(enable_expert_tensor_parallelism=True) under a TP-2 mpu (make_moe_tp.py): one file set and one set
    of expert files per tensor-parallel rank, no recorded split, every parameter whole on each rank (plain
    torch layers; the script checked the ranks agree). Refused without --tp-split, exact with `*=replicated`."""
    from inspector.scan.tp_rules import parse_rule

    folder = ckpt_dir("moe_tp_z1_bf16")
    names = os.listdir(folder / TAG)
    assert {f"layer_0_expert_{e}_mp_rank_{t:02d}_model_states.pt" for e in range(4) for t in (0, 1)} <= set(
        names
    )
    assert [f.code for f in scan(str(folder)).errors] == ["tp-unrecorded"]
    ckpt = scan(str(folder), tp_split=(parse_rule("*=replicated"),))
    assert not ckpt.errors, ckpt.errors
    assert ckpt.parallel is not None and (ckpt.parallel.tp, ckpt.world_size) == (2, 2)
    assert {f"{EXPERTS}.{e}.0.weight" for e in range(4)} <= {t.name for t in ckpt.tensors}
    assert_exact(ckpt, "moe_tp_z1_bf16", tmp_path)


def test_zero_off_fp32_reads_the_module_and_expert_files_as_the_masters(tmp_path: Path) -> None:
    """fp32 without ZeRO (moe_z0_fp32): each expert-parallel rank's expp file is the torch optimizer's own
    state (moments only); the fp32 module and expert weights are what it steps, so they are the output."""
    ckpt = scan(str(ckpt_dir("moe_z0_fp32")))
    assert not ckpt.errors, ckpt.errors
    assert ckpt.parallel is not None and (ckpt.parallel.kind, ckpt.parallel.ep) == ("expert", 2)
    assert (ckpt.world_size, ckpt.stage, ckpt.optimizer, ckpt.compute_dtype) == (
        2,
        0,
        "torch optimizer",
        "float32",
    )
    assert dict(ckpt.parallel.holders)[EXPERTS] == "experts 0-1: rank 0 · experts 2-3: rank 1"
    assert ckpt.module_copy_bytes == 0
    want = expected("moe_z0_fp32")
    masters = {k[5:]: v for k, v in want.items() if k.startswith("fp32/")}
    assert {t.name for t in ckpt.tensors} == set(masters)
    assert all(dict(t.moments).keys() == {"exp_avg", "exp_avg_sq"} for t in ckpt.tensors)
    for dtype in ("fp32", "auto"):
        out = convert(ckpt, tmp_path / dtype, dtype)
        assert set(out) == set(masters)
        for n, v in masters.items():
            assert out[n].dtype == np.float32 and np.array_equal(out[n].view(np.uint32), v.view(np.uint32)), n


def test_zero_off_fp32_moments_of_another_shape_are_refused(tmp_path: Path) -> None:
    """An expp file whose dense moments follow another order than the module: refused, never misnamed."""
    import torch

    root = writable("moe_z0_fp32", tmp_path / "ck")
    path = root / TAG / "expp_rank_0_mp_rank_00_optim_states.pt"
    sd = torch.load(path, weights_only=False)
    params = sd["optimizer"]["param_groups"][0]["params"]
    params[1], params[2] = params[2], params[1]
    torch.save(sd, path)
    ckpt = scan(str(root))
    assert [f.code for f in ckpt.errors] == ["unnamed-params"]
    assert not [t for t in ckpt.tensors if t.kind is Kind.TRAINABLE]


def test_zero_off_fused_flat_blocks_that_do_not_fill_are_refused(tmp_path: Path) -> None:
    """FP16_Optimizer's dense block one element longer than the module's parameters: its rest is explained by
    no name, so the group is refused, never cut at a guess."""
    import torch

    root = writable("moe_z0_fp16_fused", tmp_path / "ck")
    path = root / TAG / "expp_rank_0_mp_rank_00_optim_states.pt"
    sd = torch.load(path, weights_only=False)
    flat = sd["optimizer"]["fp32_groups_flat"]
    flat[0] = torch.cat([flat[0].detach(), torch.zeros(1)])
    torch.save(sd, path)
    ckpt = scan(str(root))
    assert [f.code for f in ckpt.errors] == ["unnamed-params"]
    assert not [t for t in ckpt.tensors if t.kind is Kind.TRAINABLE]
