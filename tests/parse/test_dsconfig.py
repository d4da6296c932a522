"""`ds_config` as one typed record (`parse/dsconfig.py`): the keys the scan decides on, read from the config
real DeepSpeed 0.19.8 runs saved (tests/fixtures/layouts, the config each maker script passed), and a key of
the wrong type read as absent, never as a guess."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from inspector.errors import InputError
from inspector.format.torchzip import load_tree
from inspector.parse.dsconfig import DsConfig
from inspector.parse.states import ModelStates
from inspector.parse.tree import Node
from inspector.system.source import Source

LAYOUTS = Path(__file__).resolve().parents[1] / "fixtures" / "layouts"

# fixture -> (zero stage, fp16, bf16) as its maker script configured the engine
REAL = {
    "dp_z0_fp16": (0, True, False),
    "dp_z0_fp32": (0, False, False),
    "pp_z0_bf16": (0, False, True),
    "moe_z2_fp16": (2, True, False),
    "tp_z3_bf16": (3, False, True),
}


@pytest.mark.parametrize("case", sorted(REAL))
def test_the_record_of_a_real_runs_config(case: str) -> None:
    folder = LAYOUTS / case / "ckpt" / "global_step3"
    name = "zero_pp_rank_0_mp_rank_00_model_states.pt"  # stage 3's; the others' without the prefix
    path = str(folder / (name if (folder / name).exists() else name[len("zero_pp_rank_0_") :]))
    cfg = ModelStates.parse(load_tree(path, Source.at(folder)), path).ds_config
    assert (cfg.zero_stage, cfg.fp16, cfg.bf16) == REAL[case]
    assert cfg.raw["zero_optimization"]["stage"] == REAL[case][0]  # the whole config kept, as data
    assert not cfg.data_before_expert_parallelism


@pytest.mark.parametrize(
    ("raw", "stage"),
    [({}, None), ({"zero_optimization": {"stage": 2}}, 2), ({"zero_optimization": {"stage": True}}, None),
     ({"zero_optimization": {"stage": 4}}, None), ({"zero_optimization": {"stage": -1}}, None),
     ({"zero_optimization": {"stage": "2"}}, None), ({"zero_optimization": [0]}, None)],
)
def test_a_stage_of_the_wrong_type_or_range_reads_as_absent(raw: dict[str, Any], stage: int | None) -> None:
    assert DsConfig.of(raw).zero_stage == stage


def test_dtypes_as_deepspeed_reads_them() -> None:
    """`bfloat16` is bf16's older spelling; only `enabled: true` turns one on; bf16 wins, as in DeepSpeed."""
    assert DsConfig.of({"bfloat16": {"enabled": True}}).compute_dtype == "bfloat16"
    assert DsConfig.of({"bf16": {"enabled": True}, "fp16": {"enabled": True}}).compute_dtype == "bfloat16"
    assert DsConfig.of({"fp16": {"enabled": True}}).compute_dtype == "float16"
    assert DsConfig.of({"fp16": {"enabled": "true"}, "bf16": True}).compute_dtype is None
    assert DsConfig.of({"use_data_before_expert_parallelism": True}).data_before_expert_parallelism
    assert not DsConfig.of({"use_data_before_expert_parallelism": 1}).data_before_expert_parallelism


def test_a_config_that_is_not_a_dict_is_empty_and_a_huge_one_refused() -> None:
    assert DsConfig.parse(Node(["not", "a", "dict"], "f.pt")) == DsConfig()
    assert DsConfig.parse(Node(None, "f.pt")).raw == {}
    deep: dict[str, Any] = {}
    inner = deep
    for _ in range(200):
        inner["x"] = {}
        inner = inner["x"]
    with pytest.raises(InputError):
        DsConfig.parse(Node(deep, "f.pt"))
