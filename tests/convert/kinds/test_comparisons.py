"""The DeepSpeed tool a kind sets its preflight beside: zero_to_fp32 fails on every model-parallel layout
(README "What is supported"), so a pipeline, MoE or tensor-parallel checkpoint shows no predicted figure of it."""

from __future__ import annotations

from pathlib import Path

import pytest

from inspector.convert.kinds import get
from inspector.convert.kinds.base import Request
from inspector.convert.options import ConvertOptions
from inspector.demo.writer import DemoSpec, write_demo
from inspector.scan.scanner import scan

LAYOUTS = Path(__file__).resolve().parents[2] / "fixtures" / "layouts"


def _rows(path: str, out: Path) -> list[str]:
    ckpt = scan(path)
    job = get("weights").plan(ckpt, Request(ConvertOptions(dtype="fp32")), str(out))
    return [label for label, _, _ in job.comparisons(job.assess())]


def test_a_data_parallel_checkpoint_is_set_beside_zero_to_fp32(tmp_path: Path) -> None:
    write_demo(str(tmp_path / "ck"), DemoSpec(params=200_000))
    assert _rows(str(tmp_path / "ck"), tmp_path / "out") == ["zero_to_fp32"]


@pytest.mark.parametrize("fixture", ["pp_z1_bf16", "moe_z2_bf16", "tp_z1_bf16", "autoep_z3_bf16", "tp_z3_bf16"])
def test_a_model_parallel_checkpoint_is_not(fixture: str, tmp_path: Path) -> None:
    assert _rows(str(LAYOUTS / fixture / "ckpt"), tmp_path / "out") == []
