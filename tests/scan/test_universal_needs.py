"""What a universal checkpoint needs, recorded by the layout that scanned each real fixture
(`Checkpoint.universal`): the universal kind reads these records, never the layout's name, so each layout
must fill them (tests/fixtures/layouts: DeepSpeed 0.19.8; tests/fixtures/dcp: torch 2.13)."""

from __future__ import annotations

from pathlib import Path

import pytest

from inspector.scan.scanner import scan
from inspector.scan.universal_needs import ZERO_OFF_WORDS, ExpertFiles
from tests.scan.layout_cases import ckpt_dir

DCP = Path(__file__).resolve().parents[1] / "fixtures" / "dcp"

# fixture -> (how its experts are written, the start of why a ZeRO-off save of it cannot be resumed)
CASES = {
    "dp_z0_bf16": (ExpertFiles.NONE, "a data-parallel checkpoint with ZeRO off"),
    "sp2_z1_bf16": (ExpertFiles.NONE, "a data-parallel checkpoint with ZeRO off"),
    "pp_z1_bf16": (ExpertFiles.NONE, "a pipeline-parallel checkpoint with ZeRO off"),
    "pptp_z1_bf16": (ExpertFiles.NONE, "a pipeline-parallel checkpoint with ZeRO off"),
    "tp_z1_bf16": (ExpertFiles.NONE, "a tensor-parallel checkpoint with ZeRO off"),
    "moe_z1_bf16": (ExpertFiles.LOCAL_SLOTS, "an expert-parallel checkpoint with ZeRO off (FP16_Unfused"),
    "moe_z0_fp16": (ExpertFiles.LOCAL_SLOTS, "an expert-parallel checkpoint with ZeRO off (FP16_Unfused"),
    "autoep_z2_bf16": (ExpertFiles.FUSED, "an expert-parallel checkpoint with ZeRO off (FP16_Unfused"),
    "autoep_z3_bf16": (ExpertFiles.FUSED, "an expert-parallel checkpoint with ZeRO off (FP16_Unfused"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_each_layout_says_what_universal_needs(case: str) -> None:
    ckpt = scan(str(ckpt_dir(case)))
    experts, zero_off = CASES[case]
    assert ckpt.universal.experts is experts
    assert ckpt.universal.zero_off.startswith(zero_off)
    assert not ckpt.universal.not_offered and not ckpt.saved_by  # DeepSpeed's own files


def test_the_data_parallel_words_are_the_shared_ones() -> None:
    assert scan(str(ckpt_dir("dp_z0_fp32"))).universal.zero_off.endswith(ZERO_OFF_WORDS)


@pytest.mark.parametrize(("case", "saver"), [("fsdp2_bf16", "torch.distributed"), ("titan_final", "torchtitan")])
def test_a_dcp_folder_is_foreign_and_names_its_saver(case: str, saver: str) -> None:
    ckpt = scan(str(DCP / case))
    assert ckpt.universal.not_offered.startswith("a PyTorch Distributed Checkpoint, not a DeepSpeed run")
    assert saver in ckpt.saved_by and ckpt.universal.experts is ExpertFiles.NONE
