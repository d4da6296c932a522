"""The one name rule: every name from a file that is printed, becomes a safetensors key or an output folder."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from inspector.errors import InputError
from inspector.parse.names import MAX_NAME_BYTES, check_name, name_problem


@pytest.mark.parametrize(
    "name",
    ["model.layers.0.self_attn.q_proj.weight", "lm_head.weight", "global_step100", "_orig_mod.x", "ä.ß", "a" * 255],
)
def test_real_names_pass(name: str) -> None:
    assert check_name(name, "tensor name", "f.pt", "module") == name


@pytest.mark.parametrize(
    "name",
    ["", ".", "..", "../../victim", "a/b", "a\\b", "x\x00y", "\x1b]2;t\x07", "a\u202eb", "__metadata__",
     "a" * (MAX_NAME_BYTES + 1), 3, None, ("a",)],
)
def test_unsafe_names_are_refused_with_the_file_and_field(name: object) -> None:
    with pytest.raises(InputError) as err:
        check_name(name, "tensor name", "/ckpt/mp_rank_00_model_states.pt", "module")
    text = str(err.value)
    assert "mp_rank_00_model_states.pt" in text and "module" in text
    assert "\x1b" not in text and "\x00" not in text and "\u202e" not in text


@given(st.text(max_size=300))
def test_the_rule_is_total(name: str) -> None:
    """Any string either passes unchanged or raises the one error kind, never another exception."""
    if name_problem(name):
        with pytest.raises(InputError):
            check_name(name, "name", "f", "k")
    else:
        assert check_name(name, "name", "f", "k") == name
        assert "/" not in name and name not in (".", "..")
