"""The rank-file name patterns (`scan/locate.py`): numbers as DeepSpeed 0.19.8 spells them, `{:02d}` growing
past two digits (`mp_rank_100`, `layer_100`) and `{}` unpadded, one spelling per number, bounded length."""

from __future__ import annotations

import re

import pytest

from inspector.scan.layouts.pipeline.files import LAYER_FILE_RE, LAYER_TP_RE, STAGE_RE
from inspector.scan.layouts.universal.scanner import _PARALLEL_RE
from inspector.scan.locate import EXPERT_RE, EXPP_RE, LAYER_RE, MODEL_RE, OPTIM_RE, ZERO3_MODEL_RE

# name -> the numbers its pattern must read from it, as DeepSpeed's own format strings write them
READ: list[tuple[re.Pattern[str], str, tuple[int, ...]]] = [
    (MODEL_RE, "mp_rank_00_model_states.pt", (0,)),
    (MODEL_RE, "mp_rank_07_model_states.pt", (7,)),
    (MODEL_RE, "mp_rank_100_model_states.pt", (100,)),
    (MODEL_RE, "mp_rank_12345_model_states.pt", (12345,)),
    (OPTIM_RE, "bf16_zero_pp_rank_0_mp_rank_100_optim_states.pt", (0, 100)),
    (OPTIM_RE, "zero_pp_rank_127_mp_rank_00_optim_states.pt", (127, 0)),
    (ZERO3_MODEL_RE, "zero_pp_rank_1000_mp_rank_101_model_states.pt", (1000, 101)),
    (LAYER_FILE_RE, "layer_05-model_states.pt", (5,)),
    (LAYER_FILE_RE, "layer_100-model_states.pt", (100,)),
    (LAYER_FILE_RE, "layer_1024-model_states.pt", (1024,)),
    (LAYER_TP_RE, "layer_100-model_101-model_states.pt", (100, 101)),
    (STAGE_RE, "mp_rank_101_model_states.pt", (101,)),
    (EXPP_RE, "expp_rank_100_mp_rank_00_optim_states.pt", (100, 0)),
    (_PARALLEL_RE, "mp_rank_01_model_states.pt", (1,)),
    (_PARALLEL_RE, "mp_rank_100_model_states.pt", (100,)),
]

NOT_RANK_FILES: list[tuple[re.Pattern[str], str]] = [
    (MODEL_RE, "mp_rank_0_model_states.pt"),  # {:02d} never writes one digit
    (MODEL_RE, "mp_rank_000_model_states.pt"),  # a second spelling of rank 0
    (MODEL_RE, "mp_rank_0100_model_states.pt"),
    (MODEL_RE, "mp_rank_" + "9" * 19 + "_model_states.pt"),  # past 18 digits: no number to bound
    (MODEL_RE, "mp_rank_\u0661\u0662_model_states.pt"),  # Arabic-Indic digits: \d takes them, int() reads 12
    (MODEL_RE, "mp_rank_\u0660\u0660_model_states.pt"),  # ... and here rank 0 a second time
    (OPTIM_RE, "zero_pp_rank_01_mp_rank_00_optim_states.pt"),  # {} never pads
    (OPTIM_RE, "zero_pp_rank_1_mp_rank_0_optim_states.pt"),
    (LAYER_FILE_RE, "layer_5-model_states.pt"),
    (LAYER_FILE_RE, "layer_005-model_states.pt"),
    (LAYER_TP_RE, "layer_100-model_1-model_states.pt"),
    (EXPERT_RE, "layer_00_expert_1_mp_rank_00_model_states.pt"),
    (EXPP_RE, "expp_rank_00_mp_rank_00_optim_states.pt"),
    (_PARALLEL_RE, "mp_rank_00_model_states.pt"),  # rank 0 is not "another" shard
    (_PARALLEL_RE, "mp_rank_010_model_states.pt"),
]


@pytest.mark.parametrize(("pattern", "name", "numbers"), READ, ids=[n for _, n, _ in READ])
def test_deepspeed_names_are_read_at_any_width(
    pattern: re.Pattern[str], name: str, numbers: tuple[int, ...]
) -> None:
    m = pattern.match(name)
    assert m is not None
    assert tuple(int(g) for g in m.groups() if g is not None and not g.endswith("_")) == numbers


def test_a_layer_expert_file_past_99_reads_every_number() -> None:
    m = EXPERT_RE.match("layer_100_expert_1000_mp_rank_100_model_states.pt")
    assert m is not None and (m.group(2), m.group(3), m.group(4)) == ("100", "1000", "100")
    assert LAYER_RE.match("layer_100-model_00-model_states.pt")


@pytest.mark.parametrize(("pattern", "name"), NOT_RANK_FILES, ids=[n for _, n in NOT_RANK_FILES])
def test_other_spellings_are_not_rank_files(pattern: re.Pattern[str], name: str) -> None:
    assert pattern.match(name) is None


def test_a_huge_number_is_a_bounded_int() -> None:
    """18 digits still match (the scans then refuse the rank as beyond the files present); the int is cheap."""
    m = MODEL_RE.match("mp_rank_" + "9" * 18 + "_model_states.pt")
    assert m is not None and int(m.group(1)) == 10**18 - 1
