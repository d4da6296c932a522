"""`health --against` pairs only tensors of the same shape (a finding says when a shape changed), and complex
tensors are measured by their modulus, in health and in the app's per-tensor statistics."""

from __future__ import annotations

import json
import threading
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pytest
import torch

from inspector.convert.reader import FilePool
from inspector.demo.writer import DemoSpec, write_demo
from inspector.health import run_check
from inspector.health.tensor import TensorStats, tensor_stats
from inspector.scan.scanner import scan

if TYPE_CHECKING:
    from collections.abc import Callable

    from conftest import CliResult

SPEC = DemoSpec(stage=2, world_size=2, dtype="bf16", params=20_000)
NAME = "model.layers.0.mlp.up_proj.weight"


def test_a_transposed_master_is_not_compared_element_by_element(tmp_path: Path) -> None:
    root = tmp_path / "run"
    write_demo(str(root), replace(SPEC, tag="global_step1"))
    write_demo(str(root), replace(SPEC, tag="global_step2"))
    now, then = scan(str(root), "global_step2"), scan(str(root), "global_step1")
    shape = now.tensor(NAME).shape
    assert len(shape) == 2 and shape[0] != shape[1]
    # the earlier tag holds the same values under the transposed shape: same size, another tensor
    then = replace(
        then, tensors=tuple(replace(t, shape=shape[::-1]) if t.name == NAME else t for t in then.tensors)
    )
    report = run_check(now, then)
    row = next(r for r in report.rows if r.name == NAME and r.source == "master")
    assert row.delta_norm is None  # not a made-up "moved" figure
    changed = [f for f in report.findings if f.code == "shape-changed"]
    assert [f.tensor for f in changed] == [NAME]
    assert f"({shape[0]}, {shape[1]}) here and ({shape[1]}, {shape[0]}) in global_step1" in changed[0].message
    assert not any(f.code == "not-in-against" for f in report.findings)  # said once, as what it is
    others = [r for r in report.rows if r.source == "master" and r.name != NAME]
    assert others and all(r.delta_norm == 0 for r in others)


def complex_checkpoint(tmp_path: Path) -> Path:
    root = tmp_path / "ckpt"
    write_demo(str(root), SPEC)
    path = root / "global_step3" / "mp_rank_00_model_states.pt"
    sd = torch.load(path, weights_only=True)
    sd["module"]["cbuf"] = torch.tensor([1 + 2j, 3 + 4j, 0j, -5 - 12j], dtype=torch.complex64)
    torch.save(sd, path)
    return root


TRUE_NORM = float(np.sqrt(1 + 4 + 9 + 16 + 25 + 144))  # 14.0: every imaginary part counted


def test_complex_buffer_norm_is_the_modulus_norm(tmp_path: Path, cli: Callable[..., CliResult]) -> None:
    root = complex_checkpoint(tmp_path)
    report = run_check(scan(str(root)))
    st = next(r for r in report.rows if r.name == "cbuf").stats
    assert st.norm == pytest.approx(TRUE_NORM)  # a cast to real gave sqrt(1 + 9 + 25) = 5.92
    assert (st.minimum, st.zeros) == (0.0, 1) and st.maximum == pytest.approx(13.0)
    assert st.mean == pytest.approx((np.sqrt(5) + 5 + 0 + 13) / 4)
    res = cli("health", root, "--json")
    assert res.rc == 0 and "ComplexWarning" not in res.stderr, res.output
    row = next(t for t in json.loads(res.stdout)["tensors"] if t["name"] == "cbuf")
    assert row["norm"] == pytest.approx(TRUE_NORM)


def test_complex_statistics_in_the_app_are_by_modulus(tmp_path: Path) -> None:
    ckpt = scan(str(complex_checkpoint(tmp_path)))
    t = ckpt.tensor("cbuf")
    with FilePool(ckpt.source) as pool:
        final = [
            ev for ev in tensor_stats(t.segments, pool, threading.Event()) if isinstance(ev, TensorStats)
        ]
    assert final and final[-1].maximum == pytest.approx(13.0) and final[-1].minimum == 0.0
    assert final[-1].zeros == 1


def _two_tags(tmp_path: Path) -> Path:
    root = tmp_path / "run"
    write_demo(str(root), replace(SPEC, tag="global_step1"))
    write_demo(str(root), replace(SPEC, tag="global_step2"))
    return root


def _cut_in_half(path: Path) -> None:
    with open(path, "r+b") as f:
        f.truncate(path.stat().st_size // 2)


def test_a_damaged_tag_to_compare_with_is_refused_naming_it(
    tmp_path: Path, cli: Callable[..., CliResult]
) -> None:
    """`--against T` with a rank file of T cut in half: the other tag passes the same damage checks as the
    tag itself, so it is refused (which tag, which finding; exit 1) instead of comparing nothing and exiting
    0 with an info finding about sizes."""
    from inspector.errors import DamagedCheckpointError

    root = _two_tags(tmp_path)
    cut = root / "global_step1" / "bf16_zero_pp_rank_1_mp_rank_00_optim_states.pt"
    _cut_in_half(cut)
    with pytest.raises(
        DamagedCheckpointError, match=r"The tag to compare with, global_step1, is damaged: .*"
    ):
        run_check(scan(str(root), "global_step2"), scan(str(root), "global_step1"))
    res = cli("health", root, "--tag", "global_step2", "--against", "global_step1", "--json")
    doc = json.loads(res.stdout)
    assert res.rc == 1 and set(doc) == {"error"}  # no report: nothing was compared
    assert (
        "global_step1, is damaged" in res.stderr and cut.name in res.stderr and "Traceback" not in res.stderr
    )
    assert cli("health", root, "--tag", "global_step2", "--json").rc == 0  # the tag itself is sound


def test_a_tag_to_compare_with_holding_a_stray_rank_file_is_refused(
    tmp_path: Path, cli: Callable[..., CliResult]
) -> None:
    root = _two_tags(tmp_path)
    tag = root / "global_step1"
    (tag / "bf16_zero_pp_rank_2_mp_rank_00_optim_states.pt").write_bytes(
        (tag / "bf16_zero_pp_rank_1_mp_rank_00_optim_states.pt").read_bytes()
    )
    res = cli("health", root, "--tag", "global_step2", "--against", "global_step1")
    assert res.rc == 1
    assert "bf16_zero_pp_rank_2_mp_rank_00_optim_states.pt does not belong to this checkpoint" in res.output


def test_the_tag_to_compare_with_is_scanned_with_the_same_tp_split(
    tmp_path: Path, cli: Callable[..., CliResult]
) -> None:
    """A tensor-parallel run that records no split: `--tp-split` applies to both tags, so the earlier one is
    compared, not refused for the split it was never given."""
    import shutil

    src = Path(__file__).resolve().parents[1] / "fixtures" / "layouts" / "moe_tp_z1_bf16" / "ckpt"
    root = tmp_path / "run"
    shutil.copytree(src, root)
    shutil.copytree(root / "global_step3", root / "global_step2")
    args = ("--tag", "global_step3", "--against", "global_step2", "--json")
    res = cli("health", root, *args, "--tp-split", "*=replicated")
    assert res.rc == 0, res.stderr
    doc = json.loads(res.stdout)
    assert doc["against"] == "global_step2"
    assert any(t["delta_norm"] == 0 for t in doc["tensors"] if t["source"] == "master")
    assert cli("health", root, *args).rc == 1  # without the split, the tag itself is refused
