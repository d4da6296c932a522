"""Checks on the truth itself: DeepSpeed's readers agree with each other and with FORMAT.md.

If one of these fails, the scan/convert interop tests are comparing against a questionable reference, and
FORMAT.md (or DeepSpeed) needs a second look before anyone "fixes" inspector to match.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

pytestmark = pytest.mark.interop


def test_files_and_metadata(config: str, ds_checkpoint: Callable, reference: Callable) -> None:
    """FORMAT.md 1.2: file names, the `bf16_` prefix rule, one optimizer file per DP rank, `latest`."""
    built, ref = ds_checkpoint(config), reference(config)
    cfg = built.config
    assert ref.world_size == cfg.world_size
    assert ref.stage == cfg.stage
    assert ref.bf16_optimizer == cfg.bf16_optimizer
    assert (built.root / "latest").read_text() == ref.tag  # no trailing newline
    assert (built.root / "zero_to_fp32.py").is_file()  # zero_to_torch.py only since ~0.19.6
    prefix = "bf16_" if cfg.dtype == "bf16" else ""
    want = {f"{prefix}zero_pp_rank_{r}_mp_rank_00_optim_states.pt" for r in range(cfg.world_size)}
    if cfg.stage == 3:
        want |= {f"zero_pp_rank_{r}_mp_rank_00_model_states.pt" for r in range(cfg.world_size)}
    else:
        want.add("mp_rank_00_model_states.pt")
    assert set(ref.files) == want


def test_sources_agree(config: str, reference: Callable) -> None:
    """zero_to_fp32 / ds_to_universal match an independent FORMAT.md 3.2-3.4 rebuild bit for bit."""
    ref = reference(config)
    failed = {
        k: v
        for k, v in ref.checks.items()
        if k != "zero_to_fp32_dropped" and v != "ok" and not v.startswith("rejects")
    }
    assert not failed, failed


def _bits(t: torch.Tensor) -> bytes:
    return t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


def test_master_rounds_to_module(config: str, reference: Callable) -> None:
    """Stage 1/2: each trainable param's 16-bit module copy is, bit for bit, the compute-dtype rounding of its
    master (issue 9's proof that `--source module` may stand in for the masters: every stage-1/2 config,
    bf16, fp16 with skipped overflow steps, BF16_Optimizer, gradient accumulation, frozen and tied)."""
    ref = reference(config)
    if ref.stage == 3:
        pytest.skip("stage-3 module params are empty placeholders")
    checked = 0
    for name, kind in ref.kinds.items():
        if kind in ("trainable", "tied") and name in ref.module and ref.module[name].numel():
            module = ref.module[name]
            assert module.dtype == ref.compute_dtype
            want = ref.tensors[name].to(module.dtype)
            assert _bits(want) == _bits(module), name  # -0.0 and NaN payloads count
            checked += 1
    assert checked


@pytest.mark.configs("s2_fp16_overflow", "s1_fp16_overflow_accum")
def test_overflow_configs_really_skipped_steps(config: str, ds_checkpoint: Callable) -> None:
    """The fp16 overflow configs must have skipped steps, or they would not test what they claim."""
    from inspector.format.torchzip import load_tree

    root = ds_checkpoint(config).root
    tag = (root / "latest").read_text().strip()
    ms = load_tree(root / tag / "mp_rank_00_model_states.pt")
    assert ms["skipped_steps"] > 0, ms["skipped_steps"]
    assert ms["global_steps"] > ms["skipped_steps"], "every step overflowed: nothing was trained"


def test_zero_to_fp32_drops_stage1_frozen(config: str, ds_checkpoint: Callable, reference: Callable) -> None:
    """FORMAT.md 3.3: only stage-1 frozen params are missing from zero_to_fp32; the module keeps them."""
    cfg, ref = ds_checkpoint(config).config, reference(config)
    frozen = sorted(n for n, k in ref.kinds.items() if k == "frozen")
    assert bool(frozen) == cfg.frozen
    if ref.bf16_optimizer:
        assert ref.checks["zero_to_fp32"].startswith("rejects")
        return
    dropped = sorted(filter(None, ref.checks["zero_to_fp32_dropped"].split(", ")))
    assert dropped == (frozen if cfg.zero_to_fp32_drops_frozen else [])
    for name in dropped:
        assert ref.sources[name] == "module"
        assert ref.tensors[name].dtype == ref.compute_dtype
