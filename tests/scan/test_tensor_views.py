"""AutoTP fused experts split along a 3-D view (real DeepSpeed 0.19.8 fixtures tp_experts_*, made by
make_tp.py --model experts): `mlp.up.weight` is 4 experts' [8, 16] weights stored as one [32, 16] linear,
recorded as `[4, (8,), 16]` with partition_dim 1 and widths [[4, 4]], so each rank's shard [16, 16] is every
expert's half of its rows ([4, 4, 16] flattened). The join concatenates the [4, -1, 16] views on dim 1: the
fp32 output equals the live engines' shards joined so, and its bf16 cast equals DeepSpeed's own gather of the
16-bit weight (GatherReplacedLayerParams); at ZeRO-1 also ds_to_universal's merge."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from inspector.scan.scanner import scan
from tests.scan.layout_cases import FIXTURES, HALF, ckpt_dir, convert, expected, writable

UP = "mlp.up.weight"
CASES = {"tp_experts_z1_bf16": (1, 1), "tp_experts_z3_bf16_dp2": (3, 2)}  # name -> (ZeRO stage, DP ranks)


def _live(want: dict[str, np.ndarray], name: str, view: tuple[int, ...], dim: int) -> np.ndarray:
    """The two TP ranks' live fp32 shards (data-parallel replicas equal), joined on `dim` of `view`."""
    ranks = {
        int(k.split("/")[1]): v for k, v in want.items() if k.startswith("shard/") and k.endswith(f"/{name}")
    }
    for r, v in ranks.items():
        assert np.array_equal(v.view(np.uint32), ranks[r % 2].view(np.uint32)), (name, r)
    parts = [ranks[t].reshape(view) for t in (0, 1)]
    return np.concatenate(parts, axis=dim)


@pytest.mark.parametrize("name", sorted(n for n in CASES if (FIXTURES / n).is_dir()))
def test_experts_split_along_a_view_join_bit_exact(name: str, tmp_path: Path) -> None:
    stage, dp = CASES[name]
    ckpt = scan(str(ckpt_dir(name)))
    assert not ckpt.errors, ckpt.errors
    assert ckpt.parallel is not None and (ckpt.parallel.kind, ckpt.parallel.tp, ckpt.parallel.dp) == (
        "tensor",
        2,
        dp,
    )
    assert (ckpt.stage, ckpt.world_size) == (stage, 2 * dp)
    assert ckpt.tensor(UP).shape == (32, 16)
    want = expected(name)
    live = {
        UP: _live(want, UP, (4, -1, 16), 1).reshape(32, 16),
        "mlp.down.weight": _live(want, "mlp.down.weight", (16, -1), 1),  # row-parallel: dim 1
    }
    for n in ("embed.weight", "head.weight", "head.bias"):  # replicated: every rank holds it whole
        live[n] = want[f"shard/0/{n}"]
        assert all(np.array_equal(want[f"shard/{r}/{n}"], live[n]) for r in range(2 * dp)), n
    assert not np.array_equal(live[UP], np.concatenate([want[f"shard/{t}/{UP}"] for t in (0, 1)]))
    fp32 = convert(ckpt, tmp_path / "fp32", "fp32")
    assert set(fp32) == set(live)
    for n, v in live.items():
        assert np.array_equal(fp32[n].view(np.uint32), v.view(np.uint32)), n
        if f"fp32/{n}" in want:  # ds_to_universal's own merge (it runs at ZeRO-1 only; it keeps the view)
            theirs = want[f"fp32/{n}"].reshape(v.shape)
            assert np.array_equal(fp32[n].view(np.uint32), theirs.view(np.uint32)), n
    assert stage == 3 or f"fp32/{UP}" in want
    half = convert(ckpt, tmp_path / "half", "auto")
    for n, v in live.items():
        cast = v.astype(HALF[ckpt.compute_dtype]).view(np.uint16)
        assert np.array_equal(half[n].view(np.uint16), cast), n
        assert np.array_equal(want[f"half/{n}"], cast), n  # DeepSpeed's own gather of the 16-bit weights


@pytest.mark.parametrize("shape", [[4, (8,), 15], [3, (8,), 16], [4, (8,), -1, -1]])
def test_a_view_that_does_not_fit_the_shards_is_refused(shape: list[object], tmp_path: Path) -> None:
    root = writable("tp_experts_z1_bf16", tmp_path / "ck")
    for f in ("mp_rank_00_model_states.pt", "mp_rank_01_model_states.pt"):
        path = root / "global_step3" / f
        sd = torch.load(path, weights_only=False)
        sd["universal_checkpoint_info"]["parameter_with_sub_params"][0]["shape"] = shape
        torch.save(sd, path)
    ckpt = scan(str(root))
    assert {f.code for f in ckpt.errors} == {"tp-mismatch"} and UP not in {t.name for t in ckpt.tensors}
    assert any(
        f"{UP}: the recorded sub-parameter view" in f.message and "does not fit" in f.message
        for f in ckpt.errors
    )
