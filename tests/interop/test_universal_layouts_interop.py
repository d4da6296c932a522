"""Universal checkpoints written from the model-parallel layout fixtures, resumed by real DeepSpeed at another
layout (one torchrun each, tests/interop/ds_layout_resume.py):

    AutoTP, TP 2 (tp_z1_bf16)                    -> plain model, TP 1 x DP 2
    pipeline, 2 stages, ZeRO-1 (pp_z1_bf16)      -> 1 stage x DP 2
    native MoE, EP 2 + an ep_size-1 layer, 2 ranks (moe_z1_bf16) -> 4 ranks: EP 2 x expert-DP 2
    AutoTP Phi-3, fused qkv_proj / gate_up_proj, TP 2 (tp_phi3_z1_bf16) -> plain model, TP 1 x DP 2
    pipeline 2 stages x TP 2, 4 ranks (pptp_z1_bf16) -> 1 stage x TP 2 on 2 ranks: DeepSpeed's loader cuts
        every file again by its keys (the row-parallel weight by cat_dim 1; with cat_dim 0, as written before
        the keys came from the record, it resumed that weight silently wrong)
    AutoTP under ZeRO-3, TP 2 (tp_z3_bf16; tp_z3_fp16 in fp16) -> the same layout, TP 2 ZeRO-3
    AutoTP under ZeRO-3, TP 2 x DP 2, 4 ranks (tp_z3_bf16_dp2) -> plain model, ZeRO-3 over DP 2
    legacy (non-zip) serialization, ZeRO-2 (dp_z2_bf16_legacy) -> ZeRO-1
    Ulysses sequence parallel 2, ZeRO-1 / ZeRO-3 (sp2_z1_bf16, sp2_z3_bf16) -> no SP, ZeRO-2 / ZeRO-3
    AutoTP fused experts split along a 3-D view [E, [rows], H], TP 2 at ZeRO-1 (tp_experts_z1_bf16) and
        TP 2 x DP 2 at ZeRO-3 (tp_experts_z3_bf16_dp2) -> plain model, DP 2 at the same ZeRO stage

Every trainable parameter's fp32 master and both Adam moments as the resumed engine holds them
(safe_get_full_fp32_param / safe_get_full_optimizer_state, gathered) equal, bit for bit, the source checkpoint's
(and the fp32 master the training engine held at save time, recorded in the fixture's expected.npz); the
optimizer step and global steps carry over, and one more training step runs. That ours is DeepSpeed's own
conversion where DeepSpeed has one (AutoTP, pipeline + ZeRO-1) is checked in tox -e py against its committed
output (tests/convert/kinds/test_universal_layouts.py); here ds_to_universal runs again to show that committed
output is still what it writes.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from inspector.convert.reader import read_tensor
from inspector.scan.model import Kind
from inspector.scan.scanner import scan
from tests.interop.conftest import _heavy_lock, _run_logged
from tests.interop.universal_resume import assert_committed, resumed, torchrun, with_universal
from tests.scan.layout_cases import ckpt_dir, expected

pytestmark = pytest.mark.interop

RESUME = Path(__file__).resolve().parent / "ds_layout_resume.py"
CASES = {  # fixture -> (ranks, ds_layout_resume.py options)
    "tp_z1_bf16": (2, ["tp", "--tp", "1", "--zero", "1"]),
    "pp_z1_bf16": (2, ["pipe", "--stages", "1", "--zero", "1"]),
    "moe_z1_bf16": (4, ["moe", "--ep", "2", "--second-ep", "1", "--zero", "1"]),
    "tp_phi3_z1_bf16": (2, ["tp", "--tp", "1", "--zero", "1", "--model", "phi3"]),
    "pptp_z1_bf16": (2, ["pptp", "--stages", "1", "--tp", "2", "--zero", "1"]),
    "tp_z3_bf16": (2, ["tp", "--tp", "2", "--zero", "3"]),
    "tp_z3_fp16": (2, ["tp", "--tp", "2", "--zero", "3", "--dtype", "fp16"]),
    "tp_z3_bf16_dp2": (2, ["tp", "--tp", "1", "--zero", "3"]),
    # make_plain.py's Llama is make_tp.py's: legacy (non-zip) serialization at ZeRO-2 -> ZeRO-1; Ulysses SP 2
    # (the SP size recorded as tp_degree) -> no SP, ZeRO-2 / ZeRO-3
    "dp_z2_bf16_legacy": (2, ["tp", "--tp", "1", "--zero", "1"]),
    "sp2_z1_bf16": (2, ["tp", "--tp", "1", "--zero", "2"]),
    "sp2_z3_bf16": (2, ["tp", "--tp", "1", "--zero", "3"]),
    "tp_experts_z1_bf16": (2, ["tp", "--tp", "1", "--zero", "1", "--model", "experts"]),
    "tp_experts_z3_bf16_dp2": (2, ["tp", "--tp", "1", "--zero", "3", "--model", "experts"]),
}


def _resume(config: str, out: Path, tmp_path: Path, interop_cache: Path) -> dict[str, Any]:
    """Run the resume once, retried once in a clean folder on a fresh port (a gloo rank on the CPU can abort
    at teardown after its work, as test_layouts_interop saw)."""
    ranks, opts = CASES[config]
    kind, *rest = opts

    def args(result: Path) -> list[str]:
        return [kind, str(out), str(result), *rest]

    return resumed(ranks, RESUME, args, config, tmp_path, interop_cache)


@pytest.mark.parametrize("layout", sorted(CASES))
def test_deepspeed_resumes_it_at_another_layout(
    layout: str,
    tmp_path: Path,
    interop_cache: Path,
    inspector_cli: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # DeepSpeed orders MoE groups from a set: every rank must hash alike, or their collectives disagree
    monkeypatch.setenv("PYTHONHASHSEED", "0")
    root = with_universal(layout, tmp_path, inspector_cli)
    got = _resume(layout, root, tmp_path, interop_cache)
    ckpt = scan(str(ckpt_dir(layout)))
    live = expected(layout)
    checked = 0
    for t in ckpt.tensors:
        if t.kind is not Kind.TRAINABLE:
            continue
        for state in ("fp32", "exp_avg", "exp_avg_sq"):
            want = _f32(read_tensor(ckpt, t.name) if state == "fp32" else read_tensor(ckpt, t.name, state))
            mine = got[f"{state}/{t.name}"].numpy()
            assert mine.shape == want.shape and np.array_equal(mine.view(np.uint32), want.view(np.uint32)), (
                state,
                t.name,
            )
            checked += 1
        if f"fp32/{t.name}" in live:  # the training engine at save time (a 3-D view as ds_to_universal kept it)
            theirs = live[f"fp32/{t.name}"].reshape(tuple(got[f"fp32/{t.name}"].shape))
            assert np.array_equal(got[f"fp32/{t.name}"].numpy().view(np.uint32), theirs.view(np.uint32))
    assert checked == len(_tensors(got)) and checked >= 3 * 5  # the smallest model (experts) has 5
    assert got["steps"] == [float(ckpt.optimizer_step)] and got["global_steps"] == ckpt.global_steps
    assert math.isfinite(float(got["loss_after"])) and got["global_steps_after"] == got["global_steps"] + 1


def _tensors(state: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in state.items() if "/" in k}


def _f32(x: Any) -> np.ndarray:
    return x.float().numpy() if isinstance(x, torch.Tensor) else np.asarray(x, dtype=np.float32)


@pytest.mark.parametrize(
    "layout", ["tp_z2_bf16_dp2", "pp_z1_bf16_dp2", "pptp_z1_bf16", "tp_phi3_z1_bf16_ucp03", "tp_z3_bf16_dp2"]
)
def test_the_committed_references_are_what_ds_to_universal_writes_today(layout: str, tmp_path: Path) -> None:
    """tox -e py compares ours with DeepSpeed's output committed once (tests/fixtures/universal_layouts); here
    ds_to_universal runs again on the fixture, so a DeepSpeed that converts differently shows up."""
    import subprocess

    path = Path(__file__).resolve().parents[1] / "fixtures" / "universal_layouts" / "make_refs.py"
    out = tmp_path / "today.npz"
    # a subprocess: loading DeepSpeed's files (a SubparamShape) imports deepspeed, never done in-process
    subprocess.run(
        [sys.executable, str(path), layout, str(out)], check=True, capture_output=True, timeout=300
    )
    with np.load(out) as z:
        today = {k: z[k] for k in z.files}
    assert_committed(today, path.parent / f"{layout}.npz")


@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
def test_deepspeed_at_zero_off_with_moe_never_reads_the_universal_folders_zero(
    dtype: str, tmp_path: Path, interop_cache: Path, inspector_cli: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Why a native-MoE checkpoint with ZeRO off is refused (scan/layouts/moe: ZERO_OFF_WORDS): a stage-0 MoE engine
    with load_universal, given a universal checkpoint we wrote (from the ZeRO-2 fixture), opens the
    expert-parallel ranks' ZeRO-off optimizer files in the universal folder instead of zero/, and fails."""
    monkeypatch.setenv("PYTHONHASHSEED", "0")
    config = f"moe_z2_{dtype}"  # one MoE layer, EP 2
    root = with_universal(config, tmp_path, inspector_cli)
    cmd = [*torchrun(2), str(RESUME), "moe", str(root), str(tmp_path / "r.pt")]
    cmd += ["--ep", "2", "--zero", "0", "--dtype", dtype]
    with _heavy_lock(interop_cache), pytest.raises(RuntimeError):
        _run_logged(cmd, tmp_path / "resume.log", "DeepSpeed stage-0 MoE resume", 300)
    log = (tmp_path / "resume.log").read_text(errors="replace")
    assert "FileNotFoundError" in log and "global_step3_uni/expp_rank_0_mp_rank_00_optim_states.pt" in log
