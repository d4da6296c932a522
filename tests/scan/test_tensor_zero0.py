"""AutoTP with ZeRO off, bf16 (tests/fixtures/layouts/tp_z0_bf16, made by make_tp.py --zero 0 on DeepSpeed
0.19.8): each TP rank's mp_rank_TT_model_states.pt holds its 16-bit shards in `module` and the 16-bit
optimizer's fp32 masters of those shards; the split comes from `universal_checkpoint_info`. DeepSpeed's
ds_to_universal fails on it (no *_optim_states.pt), so the truth is the live engines' own masters, joined the
way their shapes show, and DeepSpeed's own gather of the 16-bit weights."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from inspector.scan.scanner import scan
from tests.scan.layout_cases import HALF, ckpt_dir, convert, expected
from tests.scan.test_tensor import _live_join

NAME = "tp_z0_bf16"


def test_autotp_at_zero_off_joins_bit_exact(tmp_path: Path) -> None:
    ckpt = scan(str(ckpt_dir(NAME)))
    assert not ckpt.errors, ckpt.errors
    assert ckpt.parallel is not None and (ckpt.parallel.kind, ckpt.parallel.tp, ckpt.stage) == (
        "tensor",
        2,
        0,
    )
    assert ckpt.tensor("model.layers.0.mlp.down_proj.weight").shape == (16, 24)  # row-parallel: dim 1
    assert ckpt.tensor("lm_head.weight").shape == (40, 16)  # vocabulary-parallel
    want = expected(NAME)
    names = {t.name for t in ckpt.tensors}
    masters = {n: _live_join(want, n, ckpt.tensor(n).shape, tp=2) for n in names}
    fp32 = convert(ckpt, tmp_path / "fp32", "fp32")
    assert set(fp32) == names
    for n, v in masters.items():
        assert fp32[n].dtype == np.float32 and np.array_equal(fp32[n].view(np.uint32), v.view(np.uint32)), n
    half = convert(ckpt, tmp_path / "half", "auto")
    for n, v in masters.items():
        cast = v.astype(HALF[ckpt.compute_dtype]).view(np.uint16)
        assert np.array_equal(half[n].view(np.uint16), cast), n
        assert np.array_equal(want[f"half/{n}"], cast), n  # DeepSpeed's own gather of the 16-bit weights
