"""Plain data-parallel runs that earlier rounds refused or called damaged (real DeepSpeed 0.19.8 runs made by
tests/fixtures/layouts/make_plain.py; each fixture's versions.txt says how): ZeRO off in fp16, bf16 and fp32,
legacy (non-zip) serialization and Ulysses sequence parallel. Each scans without a false finding in the right words, converts bit for bit
to the live engines' fp32 masters and their 16-bit cast, and verifies (`assert_exact` runs verify)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from inspector.scan.model import Severity
from tests.scan.layout_cases import DATA_PARALLEL, FIXTURES, assert_exact, ckpt_dir, scan_layout

LEGACY = "dp_z2_bf16_legacy"
ULYSSES = sorted(p.name for p in FIXTURES.glob("sp2_z*_bf16"))
ZERO_OFF = sorted(p.name for p in FIXTURES.glob("dp_z0_*"))
PLAIN = sorted(DATA_PARALLEL)


def test_every_row_has_its_fixtures() -> None:
    assert {LEGACY, *ULYSSES, *ZERO_OFF} <= set(PLAIN) and len(ULYSSES) == 3 and len(ZERO_OFF) == 4


def test_the_legacy_fixture_is_legacy() -> None:
    """Every rank file starts with a pickle, not a zip header: the container under test really is legacy."""
    files = list((ckpt_dir(LEGACY) / "global_step3").glob("*.pt"))
    assert len(files) == 3 and all(f.read_bytes()[:2] == b"\x80\x02" for f in files)


@pytest.mark.parametrize("name", PLAIN)
def test_scans_without_a_false_finding(name: str) -> None:
    ckpt = scan_layout(name)
    assert not [f for f in ckpt.findings if f.severity is not Severity.INFO], ckpt.findings
    assert ckpt.world_size == 2 and ckpt.parallel is None


@pytest.mark.parametrize("name", ULYSSES)
def test_ulysses_is_named_in_the_scan(name: str) -> None:
    """The SP size the model states record as tp_degree is shown as sequence parallelism, not as TP."""
    ckpt = scan_layout(name)
    said = [f.message for f in ckpt.findings if f.code == "sequence-parallel"]
    assert len(said) == 1 and "sequence parallel" in said[0] and "2" in said[0], ckpt.findings


@pytest.mark.parametrize("name", PLAIN)
def test_converts_bit_exact(name: str, tmp_path: Path) -> None:
    assert_exact(scan_layout(name), name, tmp_path)


@pytest.mark.parametrize("name", ZERO_OFF)
def test_zero_off_names_its_optimizer_and_reads_the_masters(name: str) -> None:
    """fp16/bf16: FP16_UnfusedOptimizer's per-parameter masters (the module holds the 16-bit copies); fp32:
    the module's weights are the masters, the torch optimizer's moments keyed by index; every parameter has
    both Adam moments."""
    ckpt = scan_layout(name)
    assert ckpt.stage == 0 and ckpt.master_dtype == "float32"
    trainable = [t for t in ckpt.tensors if t.kind.value == "trainable"]
    assert trainable and all(dict(t.moments).keys() == {"exp_avg", "exp_avg_sq"} for t in trainable)
    if name.endswith("fp32"):
        assert ckpt.compute_dtype == "float32" and not any(t.module_copy for t in trainable)
    else:
        fused = name.endswith("fused")  # DeepSpeed's FusedAdam: FP16_Optimizer's flat blocks, cut and proven
        assert ckpt.optimizer == ("FP16_Optimizer" if fused else "FP16_UnfusedOptimizer")
        assert all(t.module_copy for t in trainable)


def test_zero_off_with_a_swapped_master_is_refused_not_misnamed(tmp_path: Path) -> None:
    """Two same-shaped masters swapped (k_proj and v_proj): their 16-bit copies prove the order wrong, so the
    scan refuses with a finding rather than name them by order."""
    import shutil

    from inspector.format.torchzip import load_tree
    from inspector.scan.scanner import scan

    root = tmp_path / "ck"
    shutil.copytree(ckpt_dir("dp_z0_fp16"), root)
    path = root / "global_step3" / "mp_rank_00_model_states.pt"
    masters = load_tree(path)["optimizer"]["fp32_groups"][0]
    k, v = masters[2], masters[3]
    assert k.shape == v.shape
    raw = bytearray(path.read_bytes())
    kb, vb = bytes(raw[k.offset : k.offset + k.nbytes]), bytes(raw[v.offset : v.offset + v.nbytes])
    assert kb != vb
    raw[k.offset : k.offset + k.nbytes], raw[v.offset : v.offset + v.nbytes] = vb, kb
    path.write_bytes(bytes(raw))
    ckpt = scan(str(root))
    assert [f.code for f in ckpt.errors] == ["unnamed-params"] and "k_proj" in ckpt.errors[0].message


def _resaved(tmp_path: Path, edit: Any, name: str = "dp_z0_fp16") -> Path:
    """A fixture copied with its model states re-saved by torch after `edit(state_dict)`."""
    import shutil

    import torch

    root = tmp_path / "ck"
    shutil.copytree(ckpt_dir(name), root)
    path = root / "global_step3" / "mp_rank_00_model_states.pt"
    sd = torch.load(path, weights_only=False)
    edit(sd)
    torch.save(sd, path)
    return root


def test_a_fused_block_that_does_not_end_at_a_parameter_is_refused(tmp_path: Path) -> None:
    """FP16_Optimizer's flat block is cut at the module's parameter sizes: one element too many (or a block
    that ends inside a parameter) is refused, never cut by guess."""
    import torch

    from inspector.errors import UnsupportedCheckpointError
    from inspector.scan.scanner import scan

    def longer(sd: dict[str, Any]) -> None:
        opt = sd["optimizer"]
        opt["fp32_groups_flat"] = [torch.cat([f, torch.zeros(1)]) for f in opt["fp32_groups_flat"]]
        for st in opt["optimizer_state_dict"]["state"].values():
            for m in ("exp_avg", "exp_avg_sq"):
                st[m] = torch.cat([st[m], torch.zeros(1)])

    with pytest.raises(UnsupportedCheckpointError, match="does not end where the module's parameters do"):
        scan(str(_resaved(tmp_path, longer, "dp_z0_fp16_fused")))


def test_model_states_without_an_optimizer_keep_their_message(tmp_path: Path) -> None:
    """Weights only (no optimizer state saved): still 'not a ZeRO checkpoint … holds the full weights'."""
    from inspector.errors import NotACheckpointError
    from inspector.scan.scanner import scan

    def drop(sd: dict[str, Any]) -> None:
        sd["optimizer"] = None

    with pytest.raises(NotACheckpointError, match=r"no \*_optim_states\.pt"):
        scan(str(_resaved(tmp_path, drop)))
