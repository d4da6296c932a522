"""Pipeline-, expert- and tensor-parallel checkpoints made afresh with real DeepSpeed (the scripts that made the
committed fixtures under tests/fixtures/layouts), read bit-exact, and set beside DeepSpeed's own tools:
ds_to_universal on pipeline + ZeRO-1 and on pipeline x tensor parallel (its fp32.pt per parameter equals our
fp32 output) and on AutoTP, fused sub-parameters and ZeRO-3 included (the expected values make_tp.py records
are its merge), and zero_to_fp32, which fails on every one of these layouts (the README's feature table says so from
these runs). One fresh build per layout: MoE without ZeRO, Phi-3's fused projections and pipeline x tensor
parallel each have their own, as do AutoTP under ZeRO-3, a pipeline of 105 layers (files past
layer_99) and MoE without ZeRO at two expert-parallel sizes."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from inspector.scan.model import Kind
from inspector.scan.scanner import scan
from tests.interop.conftest import _free_port, _heavy_lock, _run_logged, _sha, ds_env
from tests.scan.layout_cases import FIXTURES, assert_exact, convert

pytestmark = pytest.mark.interop

MADE = {  # name -> (ranks, script, its options)
    "pp_z1_bf16": (2, "make_pipe.py", ["--zero", "1", "--dtype", "bf16"]),
    "moe_z2_bf16": (2, "make_moe.py", ["--zero", "2", "--dtype", "bf16", "--ep", "2"]),
    "tp_z1_bf16": (
        2,
        "make_tp.py",
        ["--zero", "1", "--dtype", "bf16", "--tp", "2"],
    ),  # expected: ds_to_universal
    "moe_z0_bf16": (2, "make_moe.py", ["--zero", "0", "--dtype", "bf16", "--ep", "2"]),  # expp_rank_* files
    "tp_phi3_z1_bf16": (  # fused qkv_proj / gate_up_proj; expected: ds_to_universal
        2,
        "make_tp.py",
        ["--zero", "1", "--dtype", "bf16", "--tp", "2", "--model", "phi3", "--preset", "phi3"],
    ),
    "pptp_z1_bf16": (4, "make_pipe_tp.py", ["--zero", "1", "--dtype", "bf16", "--record", "1"]),  # layer_XX-model_TT
    # AutoTP under ZeRO-3: zero_pp_rank_D_mp_rank_TT model files, no mp_rank_TT_model_states.pt
    "tp_z3_bf16": (2, "make_tp.py", ["--zero", "3", "--dtype", "bf16", "--tp", "2"]),  # expected: ds_to_universal
    "pp_z1_bf16_deep": (2, "make_pipe.py", ["--zero", "1", "--dtype", "bf16", "--deep", "100"]),  # layer_100+
    "moe_z0_bf16_ep21": (  # ZeRO off, ep_size 2 + 1: unnamed groups, listed in another order on rank 1
        2,
        "make_moe.py",
        ["--zero", "0", "--dtype", "bf16", "--ep", "2", "--second-ep", "1", "--hash-seeds", "1,2"],
    ),
}


@pytest.fixture(scope="module")
def made(interop_cache: Path) -> dict[str, Path]:
    """Each layout made once per session: folder holding ckpt/ and expected.npz."""
    out = {}
    for name, (ranks, script, opts) in MADE.items():
        work = interop_cache / f"layout-{name}-{_sha((FIXTURES / script).read_bytes(), *opts)}"
        with _heavy_lock(interop_cache):
            if not (work / "expected.npz").exists():
                for attempt in (1, 2):  # a gloo rank on the CPU can abort at teardown ("terminate called
                    # without an active exception", exit -6) after its work: once in one clean-clone CI run, not in the one before
                    shutil.rmtree(work, ignore_errors=True)
                    work.mkdir(parents=True, exist_ok=True)
                    torchrun = str(Path(sys.executable).with_name("torchrun"))
                    cmd = [
                        torchrun,
                        "--nproc_per_node",
                        str(ranks),
                        "--master_addr",
                        "127.0.0.1",
                        "--master_port",
                        str(_free_port()),
                        str(FIXTURES / script),
                        str(work),
                        *opts,
                    ]
                    try:
                        _run_logged(cmd, work.parent / f"{work.name}.log", f"torchrun build of {name}")
                        break
                    except RuntimeError:
                        if attempt == 2:
                            raise
        out[name] = work
    return out


@pytest.mark.parametrize("name", sorted(MADE))
def test_a_fresh_checkpoint_converts_bit_exact(name: str, made: dict[str, Path], tmp_path: Path) -> None:
    ckpt = scan(str(made[name] / "ckpt"))
    assert not ckpt.errors and ckpt.parallel is not None
    assert_exact(ckpt, made[name], tmp_path)


@pytest.mark.parametrize("name", ["pp_z1_bf16", "pptp_z1_bf16", "pp_z1_bf16_deep"])
def test_ds_to_universal_agrees_on_pipelines(name: str, made: dict[str, Path], tmp_path: Path) -> None:
    """Pipeline + ZeRO-1, and pipeline x tensor parallel with the split recorded in the client state."""
    tag = made[name] / "ckpt" / "global_step3"
    uni = tmp_path / "uni"
    cmd = [
        sys.executable,
        "-m",
        "deepspeed.checkpoint.ds_to_universal",
        "--input_folder",
        str(tag),
        "--output_folder",
        str(uni),
        "--num_extract_workers",
        "1",
        "--num_merge_workers",
        "1",
        "--inject_missing_state",
    ]
    _run_logged(cmd, tmp_path / "ds_to_universal.log", "ds_to_universal")
    ckpt = scan(str(made[name] / "ckpt"))
    ours = convert(ckpt, tmp_path / "fp32", "fp32")
    theirs = {
        p.parent.name: torch.load(p, weights_only=False)["param"] for p in (uni / "zero").glob("*/fp32.pt")
    }
    trainable = {t.name for t in ckpt.tensors if t.kind is Kind.TRAINABLE}  # not the buffer (2.scale)
    assert set(theirs) == trainable
    for n in trainable:
        assert np.array_equal(ours[n].view(np.uint32), theirs[n].detach().numpy().view(np.uint32)), n


@pytest.mark.parametrize("name", sorted(MADE))
def test_zero_to_fp32_fails_on_these_layouts(name: str, made: dict[str, Path], tmp_path: Path) -> None:
    cmd = [
        sys.executable,
        "-m",
        "deepspeed.utils.zero_to_fp32",
        str(made[name] / "ckpt"),
        str(tmp_path / "out"),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=ds_env(), timeout=300, check=False)
    assert proc.returncode != 0
