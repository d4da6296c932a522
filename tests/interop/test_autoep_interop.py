"""MoE under ZeRO-3 through DeepSpeed's AutoEP, made afresh with real DeepSpeed (make_autoep.py, the script
behind the committed fixtures) and read bit-exact; set beside DeepSpeed's own tools: ds_to_universal's
per-parameter fp32.pt, exp_avg.pt and exp_avg_sq.pt equal what the scan reads under ZeRO-3 and ZeRO-2 (its
expert tensors are the logical all-experts tensors too), and zero_to_fp32 fails on both (the README says so)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from inspector.scan.scanner import scan
from tests.interop.conftest import _free_port, _heavy_lock, _run_logged, _sha, ds_env
from tests.scan.layout_cases import FIXTURES, assert_exact, ckpt_dir
from tests.scan.test_autoep import logical_expected

pytestmark = pytest.mark.interop

OPTS = ["--zero", "3", "--dtype", "bf16", "--ep", "2"]


@pytest.fixture(scope="module")
def made(interop_cache: Path) -> Path:
    """One fresh 2-rank AutoEP ZeRO-3 checkpoint per session: a folder holding ckpt/ and expected.npz."""
    work = interop_cache / f"layout-autoep-{_sha((FIXTURES / 'make_autoep.py').read_bytes(), *OPTS)}"
    with _heavy_lock(interop_cache):
        if not (work / "expected.npz").exists():
            shutil.rmtree(work, ignore_errors=True)
            work.mkdir(parents=True, exist_ok=True)
            torchrun = str(Path(sys.executable).with_name("torchrun"))
            cmd = [torchrun, "--nproc_per_node", "2", "--master_addr", "127.0.0.1"]
            cmd += ["--master_port", str(_free_port()), str(FIXTURES / "make_autoep.py"), str(work), *OPTS]
            _run_logged(cmd, work.parent / f"{work.name}.log", "torchrun build of the AutoEP checkpoint")
    return work


def test_a_fresh_autoep_checkpoint_converts_bit_exact(made: Path, tmp_path: Path) -> None:
    ckpt = scan(str(made / "ckpt"))
    assert not ckpt.errors and ckpt.parallel is not None
    assert_exact(ckpt, logical_expected(made, tmp_path / "want"), tmp_path)


@pytest.mark.parametrize("which", ["fresh", "autoep_z3_bf16_ws4", "autoep_z2_bf16_ws4"])
def test_ds_to_universal_agrees_with_the_scan(which: str, made: Path, tmp_path: Path) -> None:
    root = made / "ckpt" if which == "fresh" else ckpt_dir(which)
    uni = tmp_path / "uni"
    cmd = [sys.executable, "-m", "deepspeed.checkpoint.ds_to_universal", "--input_folder"]
    cmd += [str(root / "global_step3"), "--output_folder", str(uni)]
    cmd += ["--num_extract_workers", "1", "--num_merge_workers", "1"]
    _run_logged(cmd, tmp_path / "ds_to_universal.log", "ds_to_universal")
    ckpt = scan(str(root))
    compared = 0
    for t in ckpt.tensors:
        if t.alias_of is not None:
            continue
        for kind, segs in (("fp32", t.segments), *t.moments):
            saved = torch.load(uni / "zero" / t.name / f"{kind}.pt", weights_only=True)
            theirs = saved["param"] if isinstance(saved, dict) else saved  # the moments are bare tensors
            ours = np.concatenate([np.fromfile(s.file, np.float32, s.numel, offset=s.offset) for s in segs])
            # ds_to_universal writes some dense 2-D weights flat: compare the elements
            assert np.array_equal(
                ours.view(np.uint32), theirs.detach().reshape(-1).numpy().view(np.uint32)
            ), (
                t.name,
                kind,
            )
            compared += 1
    assert compared == 3 * 13  # 13 parameters (3 of them all-experts tensors), each with 2 Adam moments


@pytest.mark.parametrize(
    ("which", "says"),
    [("fresh", "does not support AutoEP ZeRO-3"), ("autoep_z2_bf16", "is not a model state checkpoint")],
)
def test_zero_to_fp32_fails_on_autoep(which: str, says: str, made: Path, tmp_path: Path) -> None:
    """ZeRO-3: refused by name. ZeRO-1/2: it trips over the per-expert files it takes for rank files."""
    root = made / "ckpt" if which == "fresh" else ckpt_dir(which)
    cmd = [sys.executable, "-m", "deepspeed.utils.zero_to_fp32", str(root), str(tmp_path / "out")]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=ds_env(), timeout=300, check=False)
    assert proc.returncode != 0 and says in proc.stderr + proc.stdout
