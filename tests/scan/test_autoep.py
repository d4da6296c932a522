"""MoE under ZeRO-3 through DeepSpeed's AutoEP, saved by real DeepSpeed 0.19.8 (tests/fixtures/layouts/
make_autoep.py): every expert weight rebuilt whole from its expert-data-parallel partitions and the affine
maps, experts in global order, converted bit-exact against what the live engines held, and damage reported
as findings."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from inspector.errors import InputError
from inspector.scan.model import Kind
from inspector.scan.scanner import scan
from tests.scan.layout_cases import assert_exact, ckpt_dir, expected, scan_without, writable

TAG = "global_step3"
EXPERTS = "model.layers.0.mlp.experts"
ROUTER = "model.layers.0.mlp.router.gate.weight"
ALIAS = "model.layers.0.mlp.gate.gate.weight"
EXACT = {  # fixture -> (ranks, ZeRO stage, who holds the experts)
    "autoep_z3_bf16": (2, 3, "experts 0-1: rank 0 · experts 2-3: rank 1"),
    "autoep_z3_fp16": (2, 3, "experts 0-1: rank 0 · experts 2-3: rank 1"),
    "autoep_z3_bf16_ws4": (4, 3, "experts 0-1: ranks 0, 2 · experts 2-3: ranks 1, 3"),
    "autoep_z2_bf16": (2, 2, "experts 0-1: rank 0 · experts 2-3: rank 1"),
    "autoep_z2_bf16_ws4": (4, 2, "experts 0-1: ranks 0, 2 · experts 2-3: ranks 1, 3"),
}


def logical_expected(name: str, dest: Path) -> Path:
    """The fixture's live values with each expert tensor's per-expert slices (`<name>/<global expert>`)
    stacked in global order, and the router's alias (one parameter under two names), in `dest`."""
    flat: dict[str, list[tuple[int, np.ndarray]]] = {}
    out: dict[str, np.ndarray] = {}
    for key, value in expected(name).items():
        head, _, tail = key.rpartition("/")
        if tail.isdigit():
            flat.setdefault(head, []).append((int(tail), value))
        else:
            out[key] = value
    for key, slices in flat.items():
        assert [k for k, _ in sorted(slices, key=lambda s: s[0])] == list(range(4)), key
        out[key] = np.stack([v for _, v in sorted(slices, key=lambda s: s[0])])
    for kind in ("fp32", "half"):
        out[f"{kind}/{ALIAS}"] = out[f"{kind}/{ROUTER}"]
    dest.mkdir()
    np.savez(dest / "expected.npz", **out)
    return dest


@pytest.mark.parametrize("name", sorted(EXACT))
def test_autoep_converts_bit_exact(name: str, tmp_path: Path) -> None:
    ranks, stage, holders = EXACT[name]
    ckpt = scan(str(ckpt_dir(name)))
    assert not ckpt.errors, ckpt.errors
    dtype = "float16" if name.endswith("fp16") else "bfloat16"
    assert (ckpt.world_size, ckpt.stage, ckpt.compute_dtype) == (ranks, stage, dtype)
    assert ckpt.parallel is not None and (ckpt.parallel.kind, ckpt.parallel.ep) == ("expert", 2)
    assert dict(ckpt.parallel.holders)[EXPERTS] == holders
    w1 = ckpt.tensor(f"{EXPERTS}.w1")
    assert w1.shape == (4, 24, 16) and w1.kind is Kind.TRAINABLE and w1.moments
    assert ckpt.tensor(ALIAS).alias_of == ROUTER
    # ZeRO-1/2: the 16-bit experts from the per-expert files, joined in global order; ZeRO-3 saves none
    assert all(bool(t.module_copy) == (stage < 3) for t in ckpt.tensors if t.kind is Kind.TRAINABLE)
    assert_exact(ckpt, logical_expected(name, tmp_path / "want"), tmp_path)


def test_expert_moments_follow_the_experts() -> None:
    """Adam's moments are placed with the same pieces as the masters: same files, same offsets."""
    ckpt = scan(str(ckpt_dir("autoep_z3_bf16_ws4")))
    w2 = ckpt.tensor(f"{EXPERTS}.w2")
    for _, segs in w2.moments:
        assert [s.numel for s in segs] == [s.numel for s in w2.segments]
        assert [s.file for s in segs] == [s.file for s in w2.segments]


def test_a_missing_rank_file_is_named(tmp_path: Path) -> None:
    ckpt = scan_without("autoep_z3_bf16_ws4", tmp_path, "bf16_zero_pp_rank_3_mp_rank_00_optim_states.pt")
    assert any(f.code == "missing-rank" and "rank 3" in f.message for f in ckpt.errors)
    assert not [t for t in ckpt.tensors if t.kind is Kind.TRAINABLE]


def test_a_missing_model_states_file_is_named(tmp_path: Path) -> None:
    ckpt = scan_without("autoep_z3_bf16", tmp_path, "zero_pp_rank_1_mp_rank_00_model_states.pt")
    assert any(f.code == "missing-rank" and "rank 1" in f.message for f in ckpt.errors)


def _resave(path: Path, edit) -> None:  # type: ignore[no-untyped-def]
    import torch

    sd = torch.load(path, weights_only=False)
    torch.save(edit(sd), path)


def _layers(sd: dict, edit) -> dict:  # type: ignore[no-untyped-def,type-arg]
    sd["ds_autoep_layers"] = [edit(dict(e)) for e in sd["ds_autoep_layers"]]
    return sd


def test_a_truncated_autoep_record_is_a_finding(tmp_path: Path) -> None:
    """Rank 1's expert metadata cut short (no affine maps, no ep_rank): a finding naming it, no traceback."""
    root = writable("autoep_z3_bf16", tmp_path / "ck")
    path = root / TAG / "zero_pp_rank_1_mp_rank_00_model_states.pt"
    _resave(path, lambda sd: _layers(sd, lambda e: {k: e[k] for k in ("moe_layer_id", "module_path")}))
    ckpt = scan(str(root))
    assert ckpt.errors and all(f.code == "layout" for f in ckpt.errors), ckpt.errors
    assert "zero_pp_rank_1_mp_rank_00_model_states.pt" in ckpt.errors[0].message
    assert not [t for t in ckpt.tensors if t.name.startswith(EXPERTS)]


def test_a_truncated_model_states_file_is_a_finding(tmp_path: Path) -> None:
    root = writable("autoep_z3_bf16", tmp_path / "ck")
    path = root / TAG / "zero_pp_rank_1_mp_rank_00_model_states.pt"
    path.write_bytes(path.read_bytes()[:4000])
    ckpt = scan(str(root))
    assert ckpt.errors and not [t for t in ckpt.tensors if t.name.startswith(EXPERTS)]


def _shift_piece(e: dict) -> dict:  # type: ignore[type-arg]
    pieces = e["affine_maps"]["params"][f"{EXPERTS}.w1"]["ranks"][1]["pieces"]
    pieces[0]["source"] = [700, pieces[0]["source"][1]]
    return e


def test_an_affine_map_that_leaves_a_gap_is_a_finding(tmp_path: Path) -> None:
    """Rank 0's record of where expert-parallel rank 1's piece goes, moved: the pieces overlap and leave a
    gap; the scan says which tensor and which ranks' records disagree, and does not raise."""
    root = writable("autoep_z3_bf16", tmp_path / "ck")
    _resave(root / TAG / "zero_pp_rank_0_mp_rank_00_model_states.pt", lambda sd: _layers(sd, _shift_piece))
    ckpt = scan(str(root))
    assert [f.code for f in ckpt.errors] == ["layout"]
    assert "Rank 1 records other AutoEP layers" in ckpt.errors[0].message
    for r in (1,):  # every rank's record alike: the map itself is refused
        _resave(
            root / TAG / f"zero_pp_rank_{r}_mp_rank_00_model_states.pt", lambda sd: _layers(sd, _shift_piece)
        )
    ckpt = scan(str(root))
    assert [f.code for f in ckpt.errors] == ["layout"]
    assert f"{EXPERTS}.w1: the AutoEP affine map's pieces do not cover" in ckpt.errors[0].message


def _scaled_piece(e: dict) -> dict:  # type: ignore[type-arg]
    e["affine_maps"]["params"][f"{EXPERTS}.w1"]["ranks"][1]["pieces"][0]["scale"] = 0.5
    return e


def test_a_scaled_piece_is_refused_not_written_as_stored(tmp_path: Path) -> None:
    """A piece held at scale 0.5 (issue 38): the stored values are not the weights, so the record is refused
    naming the field (an input error: exit non-zero, no traceback), as the tensor-parallel map's are."""
    root = writable("autoep_z3_bf16", tmp_path / "ck")
    for r in (0, 1):
        path = root / TAG / f"zero_pp_rank_{r}_mp_rank_00_model_states.pt"
        _resave(path, lambda sd: _layers(sd, _scaled_piece))
    with pytest.raises(InputError, match="is a scale other than 1"):
        scan(str(root))


def test_an_unknown_format_version_is_refused_by_name(tmp_path: Path) -> None:
    root = writable("autoep_z3_bf16", tmp_path / "ck")
    path = root / TAG / "zero_pp_rank_1_mp_rank_00_model_states.pt"
    _resave(path, lambda sd: _layers(sd, lambda e: {**e, "checkpoint_format_version": 2}))
    ckpt = scan(str(root))
    assert [f.code for f in ckpt.errors] == ["layout"]
    assert "format version" in ckpt.errors[0].message


def test_a_missing_expert_file_is_named(tmp_path: Path) -> None:
    ckpt = scan_without("autoep_z2_bf16", tmp_path, "layer_0_expert_3_mp_rank_00_model_states.pt")
    assert [f.code for f in ckpt.errors] == ["missing-expert"]
    assert "expert 3 of AutoEP layer model.layers.0.mlp" in ckpt.errors[0].message
    assert not ckpt.tensor(f"{EXPERTS}.w1").module_copy  # the masters are still whole


def test_a_zero2_run_with_data_before_expert_parallelism_is_refused(tmp_path: Path) -> None:
    """That option regroups the ranks and no ZeRO-1/2 file records how: refused by name, never placed by the
    default rule."""
    root = writable("autoep_z2_bf16", tmp_path / "ck")
    flag = {"use_data_before_expert_parallelism": True}
    _resave(
        root / TAG / "mp_rank_00_model_states.pt", lambda sd: {**sd, "ds_config": {**sd["ds_config"], **flag}}
    )
    ckpt = scan(str(root))  # the optimizer files' config (left alone here) then differs too: mixed-runs
    assert {f.code for f in ckpt.errors} == {"layout", "mixed-runs"}
    assert any("use_data_before_expert_parallelism" in f.message for f in ckpt.errors)
    assert not [t for t in ckpt.tensors if t.name.startswith(EXPERTS)]


def test_swapped_rank_files_are_caught(tmp_path: Path) -> None:
    """Rank 0's and rank 1's expert shards differ: files swapped into each other's place are named, because
    each optimizer file records its own place in its partition group."""
    root = writable("autoep_z3_bf16_ws4", tmp_path / "ck")
    a, b = (root / TAG / f"bf16_zero_pp_rank_{r}_mp_rank_00_optim_states.pt" for r in (0, 2))
    tmp = a.read_bytes()
    a.write_bytes(b.read_bytes())
    b.write_bytes(tmp)
    ckpt = scan(str(root))
    assert [f.code for f in ckpt.errors] == ["layout"]
    assert "Rank 0's optimizer file says it is partition 2" in ckpt.errors[0].message
