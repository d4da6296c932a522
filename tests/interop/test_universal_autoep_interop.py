"""A universal checkpoint written from an AutoEP fixture, resumed by real DeepSpeed (tests/interop/
ds_autoep_resume.py, one torchrun): autoep_z3_bf16_ws4 (ZeRO-3, 4 ranks, EP 2 x expert-DP 2) -> 2 ranks,
EP 2 x expert-DP 1, so each expert-parallel rank's experts are cut out of the whole `[num_experts, ...]` tensors
by the keys its files carry (`is_expert_param`, `ep_num_experts`) and re-partitioned over a smaller group.

Every trainable parameter's fp32 master and both Adam moments as the resumed engine holds them
(safe_get_full_fp32_param / safe_get_full_optimizer_state; an expert tensor's slices under their global
expert index) equal, bit for bit, the source checkpoint's and the fp32 masters the training engine held at
save time (the fixture's expected.npz); the optimizer step and global steps carry over. That ours equals
ds_to_universal's is checked in tox -e py (tests/convert/kinds/test_universal_autoep.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from inspector.convert.reader import read_tensor
from inspector.scan.model import Kind
from inspector.scan.scanner import scan
from tests.interop.universal_resume import assert_committed, resumed, with_universal
from tests.scan.layout_cases import ckpt_dir, expected

pytestmark = pytest.mark.interop

RESUME = Path(__file__).resolve().parent / "ds_autoep_resume.py"
FIXTURE = "autoep_z3_bf16_ws4"


def _resume(out: Path, tmp_path: Path, interop_cache: Path) -> dict[str, Any]:
    """The resume on 2 ranks, EP 2, ZeRO-3."""

    def args(result: Path) -> list[str]:
        return [str(out), str(result), "--zero", "3", "--ep", "2"]

    return resumed(2, RESUME, args, FIXTURE, tmp_path, interop_cache)


def _pairs(got: dict[str, Any], state: str, name: str, whole: np.ndarray) -> list[tuple[np.ndarray, np.ndarray]]:
    """(resumed, source) for a parameter: whole, or per global expert for an AutoEP expert tensor."""
    if f"{state}/{name}" in got:
        return [(got[f"{state}/{name}"].numpy(), whole)]
    return [(got[f"{state}/{name}/{k}"].numpy(), whole[k]) for k in range(whole.shape[0])]


def test_deepspeed_resumes_it_on_fewer_ranks(
    tmp_path: Path, interop_cache: Path, inspector_cli: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # DeepSpeed orders MoE groups from a set: every rank must hash alike, or their collectives disagree
    monkeypatch.setenv("PYTHONHASHSEED", "0")
    root = with_universal(FIXTURE, tmp_path, inspector_cli)
    got = _resume(root, tmp_path, interop_cache)
    ckpt, live = scan(str(ckpt_dir(FIXTURE))), expected(FIXTURE)
    checked, experts = 0, 0
    for t in ckpt.tensors:
        if t.kind is not Kind.TRAINABLE:
            continue
        for state in ("fp32", "exp_avg", "exp_avg_sq"):
            whole = np.asarray(read_tensor(ckpt, t.name, state), dtype=np.float32).reshape(t.shape)
            for mine, want in _pairs(got, state, t.name, whole):
                assert mine.shape == want.shape and mine.tobytes() == want.tobytes(), (state, t.name)
                checked += 1
            experts += f"{state}/{t.name}" not in got
        for key in [k for k in live if k == f"fp32/{t.name}" or k.startswith(f"fp32/{t.name}/")]:
            assert got[key].numpy().tobytes() == live[key].astype(np.float32).tobytes(), key
    assert experts == 3 * 3  # w1, w2, w3: each cut into its experts
    assert checked == len([k for k in got if "/" in k]) and checked >= 3 * 10
    assert got["steps"] == [float(ckpt.optimizer_step)] and got["global_steps"] == ckpt.global_steps


@pytest.mark.parametrize("layout", ["autoep_z3_bf16", "autoep_z2_bf16"])
def test_the_committed_references_are_what_ds_to_universal_writes_today(layout: str) -> None:
    """tox -e py compares ours with DeepSpeed's output committed once (tests/fixtures/universal_layouts/
    autoep_*.npz); here ds_to_universal runs again, so a DeepSpeed that converts AutoEP differently shows up."""
    from tests.scripts import load_script

    path = Path(__file__).resolve().parents[1] / "fixtures" / "universal_layouts" / "make_autoep_refs.py"
    make_refs = load_script(path)
    assert_committed(make_refs.reference(layout), path.parent / f"{layout}.npz")
