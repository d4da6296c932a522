"""Pipelines saved with ZeRO off in fp16 (FP16_UnfusedOptimizer, 2 stages, real DeepSpeed 0.19.8 fixture
pp_z0_fp16): the stages' unnamed fp32 masters named by layer-file order, each proven by its 16-bit copy, and
converted bit-exact; masters out of order are refused, never misnamed."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from inspector.scan.model import Checkpoint, Kind, Severity
from inspector.scan.scanner import scan
from tests.scan.layout_cases import HALF, ckpt_dir, convert, expected, writable

TAG = "global_step3"
TIED = "tied_modules.embed.weight"  # the live name; the save writes the key nowhere: named by its layer file


def _edit_stage(root: Path, stage: int, edit: object) -> None:
    """Rewrite one stage file's fp32_groups with `edit(groups)` (torch only to damage a copy)."""
    import torch

    path = root / TAG / f"mp_rank_{stage:02d}_model_states.pt"
    sd = torch.load(path, weights_only=False)
    edit(sd["optimizer"]["fp32_groups"])  # type: ignore[operator]
    torch.save(sd, path)


def _no_trainable(ckpt: Checkpoint) -> bool:
    return not [t for t in ckpt.tensors if t.kind is Kind.TRAINABLE]


@pytest.mark.parametrize(
    "name, optimizer",
    [("pp_z0_fp16", "FP16_UnfusedOptimizer"), ("pp_z0_fp16_fused", "FP16_Optimizer")],  # --fused-adam: flat
)
def test_zero_off_fp16_pipeline_converts_bit_exact(name: str, optimizer: str, tmp_path: Path) -> None:
    ckpt = scan(str(ckpt_dir(name)))
    assert not ckpt.errors, ckpt.errors
    assert (ckpt.optimizer, ckpt.stage, ckpt.compute_dtype, ckpt.master_dtype) == (
        optimizer,
        0,
        "float16",
        "float32",
    )
    assert [t.name for t in ckpt.tensors] == [
        "0.weight",
        "1.weight",
        "1.bias",
        "2.scale",
        "2.norm.weight",
        "2.norm.bias",
        "4.weight",
        "4.bias",
    ]
    assert [f.code for f in ckpt.findings if f.severity is Severity.WARNING] == [
        "tied-unnamed"
    ]  # stage 1's tied copy, proven, key unknown
    holders = dict(ckpt.parallel.holders) if ckpt.parallel else {}
    assert holders == {"stage 0": "layers 0-2 · ranks 0", "stage 1": "layers 0, 4 · ranks 1"}
    want = expected(name)
    rename = {TIED: "0.weight"}
    masters = {rename.get(k[5:], k[5:]): v for k, v in want.items() if k.startswith("fp32/")}
    fp32 = convert(ckpt, tmp_path / "fp32", "fp32")
    assert set(fp32) == set(masters) | {"2.scale"}
    for n, v in masters.items():
        assert np.array_equal(fp32[n].view(np.uint32), v.view(np.uint32)), n
    assert np.array_equal(fp32["2.scale"], want["buffer/2.scale"])
    half = convert(ckpt, tmp_path / "half", "auto")
    for n, v in masters.items():
        cast = v.astype(HALF["float16"]).view(np.uint16)
        assert np.array_equal(half[n].view(np.uint16), cast), n
    for s in (0, 1):  # the live tied copy of each stage equals the master written
        assert np.array_equal(want[f"tied/{TIED}/{s}"].view(np.uint32), fp32["0.weight"].view(np.uint32))


@pytest.mark.parametrize("stage, a, b", [(0, 2, 3), (1, 1, 2)])
def test_swapped_masters_are_refused_not_misnamed(stage: int, a: int, b: int, tmp_path: Path) -> None:
    """Stage 0's 1.bias and 2.norm.weight masters share a shape; stage 1's 4.weight and 4.bias do not."""
    root = writable("pp_z0_fp16", tmp_path / "ck")

    def swap(groups: list) -> None:  # type: ignore[type-arg]
        groups[0][a], groups[0][b] = groups[0][b], groups[0][a]

    _edit_stage(root, stage, swap)
    ckpt = scan(str(root))
    assert {f.code for f in ckpt.errors} == {"unnamed-params"}
    assert f"Stage {stage}'s fp32 master {a}" in ckpt.errors[0].message
    assert _no_trainable(ckpt)


def test_a_tied_master_that_proves_nothing_is_refused(tmp_path: Path) -> None:
    """Stage 1's leading master is the tied embedding; damaged, it equals no layer parameter's copy."""
    root = writable("pp_z0_fp16", tmp_path / "ck")
    _edit_stage(root, 1, lambda groups: groups[0][0].data.mul_(2))
    ckpt = scan(str(root))
    assert [f.code for f in ckpt.errors] == ["unnamed-params"]
    assert "proves equal to no layer parameter" in ckpt.errors[0].message
    assert _no_trainable(ckpt)


def test_a_layer_parameter_without_a_master_is_refused(tmp_path: Path) -> None:
    root = writable("pp_z0_fp16", tmp_path / "ck")
    _edit_stage(root, 1, lambda groups: groups[0].pop())
    ckpt = scan(str(root))
    assert [f.code for f in ckpt.errors] == ["unnamed-params"]
    assert "4.bias" in ckpt.errors[0].message and ckpt.errors[0].severity is Severity.ERROR
    assert _no_trainable(ckpt)


def test_zero_off_fp32_pipeline_reads_the_layer_files_as_the_weights(tmp_path: Path) -> None:
    """fp32 without ZeRO (pp_z0_fp32): no masters anywhere, the torch optimizer steps the layer weights in
    place; the stage's Adam moments are named by its running index (torch's own loader reads them so)."""
    ckpt = scan(str(ckpt_dir("pp_z0_fp32")))
    assert not ckpt.errors, ckpt.errors
    assert (ckpt.optimizer, ckpt.stage, ckpt.compute_dtype, ckpt.master_dtype) == (
        "torch optimizer",
        0,
        "float32",
        "float32",
    )
    assert ckpt.module_copy_bytes == 0  # the layer files hold the masters themselves, not a copy
    holders = dict(ckpt.parallel.holders) if ckpt.parallel else {}
    assert holders == {"stage 0": "layers 0-2 · ranks 0", "stage 1": "layers 0, 4 · ranks 1"}
    trainable = {t.name: t for t in ckpt.tensors if t.kind is Kind.TRAINABLE}
    assert set(trainable) == {
        "0.weight",
        "1.weight",
        "1.bias",
        "2.norm.weight",
        "2.norm.bias",
        "4.weight",
        "4.bias",
    }
    assert all(dict(t.moments).keys() == {"exp_avg", "exp_avg_sq"} for t in trainable.values())
    want = expected("pp_z0_fp32")
    masters = {k[5:].replace(TIED, "0.weight"): v for k, v in want.items() if k.startswith("fp32/")}
    fp32 = convert(ckpt, tmp_path / "fp32", "fp32")
    assert set(fp32) == set(masters) | {"2.scale"}
    for n, v in masters.items():
        assert np.array_equal(fp32[n].view(np.uint32), v.view(np.uint32)), n
    for s in (0, 1):  # each stage's live tied weight is the one written
        assert np.array_equal(want[f"tied/{TIED}/{s}"].view(np.uint32), fp32["0.weight"].view(np.uint32))
    native = convert(ckpt, tmp_path / "native", "auto")
    assert all(np.array_equal(native[n].view(np.uint32), v.view(np.uint32)) for n, v in masters.items())


def test_zero_off_fp32_moments_out_of_order_are_refused(tmp_path: Path) -> None:
    """Stage 1's moments listed in another order than its layers: their shapes no longer follow the layer
    files, so the stage is refused rather than its moments misnamed."""
    import torch

    root = writable("pp_z0_fp32", tmp_path / "ck")
    path = root / TAG / "mp_rank_01_model_states.pt"
    sd = torch.load(path, weights_only=False)
    params = sd["optimizer"]["param_groups"][0]["params"]
    params[1], params[2] = params[2], params[1]
    torch.save(sd, path)
    ckpt = scan(str(root))
    assert [f.code for f in ckpt.errors] == ["unnamed-params"]
    assert (
        "Stage 1's optimizer entry 1 (shape (16,)) proves equal to no layer parameter (shape compared)"
        in (ckpt.errors[0].message)
    )
    assert _no_trainable(ckpt)


def test_a_fused_stage_whose_flat_block_proves_nothing_is_refused(tmp_path: Path) -> None:
    """FP16_Optimizer's flat block of stage 1 altered where the tied embedding's piece lies: no layer
    parameter's 16-bit copy proves it, so the stage is refused, never cut at a guessed boundary."""
    import torch

    root = writable("pp_z0_fp16_fused", tmp_path / "ck")
    path = root / TAG / "mp_rank_01_model_states.pt"
    sd = torch.load(path, weights_only=False)
    sd["optimizer"]["fp32_groups_flat"][0].data[:592].mul_(2)
    torch.save(sd, path)
    ckpt = scan(str(root))
    assert [f.code for f in ckpt.errors] == ["unnamed-params"]
    assert "fp32 master 0 (at element 0 of group 0's flat block) proves equal to no layer" in ckpt.errors[0].message
    assert _no_trainable(ckpt)


def test_a_zero_off_stage_optimizer_of_an_unknown_form_is_not_supported_yet(tmp_path: Path) -> None:
    """ZeRO off writes no optimizer files: a stage file whose optimizer record has no known form is "not
    supported yet", never "damaged ... copy the complete checkpoint folder"."""
    import torch

    from inspector.errors import UnsupportedCheckpointError

    root = writable("pp_z0_fp32", tmp_path / "ck")
    path = root / TAG / "mp_rank_01_model_states.pt"
    sd = torch.load(path, weights_only=False)
    sd["optimizer"] = {"some_future_optimizer": [1, 2]}
    torch.save(sd, path)
    with pytest.raises(UnsupportedCheckpointError, match="pipeline stage 1 was saved with ZeRO off") as err:
        scan(str(root))
    assert "not supported yet" in err.value.message and "Copy" not in err.value.message + err.value.hint
