"""PEFT's `rank_pattern` / `alpha_pattern` keys matched in linear time: the same answers as PEFT's
`re.match(rf"(.*\\.)?({key})$", name)` on the syntax PEFT users write (a differential property test against
Python's engine), a key that makes the backtracking engine run for ever answered at once, and what is not
regular refused with a message."""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from inspector.parse.pattern import PatternError, SuffixPattern, compile_pattern
from inspector.scan.peft import detect_adapter
from tests.convert.kinds.hf import lora_checkpoint

_ATOMS = st.sampled_from(["a", "b", ".", r"\.", r"\d", "[ab]", "[^.]", "_", "(a|b)", "(?:ab|.)", "1"])
_QUANT = st.sampled_from(["", "", "*", "+", "?", "{1,2}", "{2}", "*?"])
_KEYS = st.lists(st.tuples(_ATOMS, _QUANT), min_size=1, max_size=6).map(
    lambda p: "".join(a + q for a, q in p)
)
_NAMES = st.text(alphabet="ab._1", max_size=12)


def peft_matches(key: str, name: str) -> bool:
    return re.match(rf"(.*\.)?({key})$", name) is not None


@settings(max_examples=400, deadline=None)
@given(key=_KEYS, names=st.lists(_NAMES, min_size=1, max_size=8))
def test_the_linear_matcher_answers_as_peft_does(key: str, names: list[str]) -> None:
    pattern = compile_pattern(key)
    for name in names:
        assert pattern.matches(name) == peft_matches(key, name), (key, name)


@pytest.mark.parametrize(
    ("key", "name", "expected"),
    [
        ("q_proj", "model.layers.0.self_attn.q_proj", True),
        ("q_proj", "model.layers.0.self_attn.xq_proj", False),
        (r"layers\.1\d\.mlp\.(up|down)_proj", "model.layers.12.mlp.down_proj", True),
        ("^model.layers.0.q_proj$", "model.layers.0.q_proj", True),
        ("^layers.0.q_proj", "model.layers.0.q_proj", False),
    ],
)
def test_common_keys(key: str, name: str, expected: bool) -> None:
    assert compile_pattern(key).matches(name) is expected is peft_matches(key, name)


def test_a_key_that_backtracks_for_ever_is_answered_by_counting_steps() -> None:
    """`.*` sixty times then `!`: Python's engine tries every split of the name (it does not finish); the
    NFA takes one step per character per state. Counted, not timed: the predicate calls are bounded by
    name length times states."""
    key = ".*" * 60 + "!"
    pattern = compile_pattern(key)
    calls = 0
    states = []
    for s in pattern.states:
        if s.pred is not None:
            inner = s.pred

            def counted(c: str, inner: Any = inner) -> bool:
                nonlocal calls
                calls += 1
                return bool(inner(c))

            s.pred = counted
        states.append(s)
    name = "model.layers.0.self_attn.q_proj" * 4
    assert pattern.matches(name) is False
    assert calls <= len(name) * len(pattern.states)


@pytest.mark.parametrize("key", [r"(a)\1", "(?=a)b", "(?i)q_proj", r"\bq", "(?P<x>q)"])
def test_what_is_not_regular_is_refused(key: str) -> None:
    with pytest.raises(PatternError):
        compile_pattern(key)


def test_a_scan_with_a_catastrophic_rank_pattern_key_finishes(demo: Any, tmp_path: Path) -> None:
    key = ".*" * 40 + "!"
    start = time.monotonic()
    ckpt = lora_checkpoint(demo, tmp_path, rank_pattern={key: 8, "q_proj": 4})
    adapter = detect_adapter(ckpt)
    assert adapter is not None
    assert {ly.r for ly in adapter.layers if ly.module.endswith("q_proj")} == {4}
    print(f"\nscan with a catastrophic key: {time.monotonic() - start:.2f} s")


def test_a_non_regular_key_in_a_config_is_a_clear_error(demo: Any, tmp_path: Path) -> None:
    from inspector.scan.json_view import adapter_json

    ckpt = lora_checkpoint(demo, tmp_path, rank_pattern={r"(q)\1_proj": 8})
    info = adapter_json(ckpt)
    assert info is not None and "module-name suffixes" in info["error"]


def test_literal_keys_take_the_suffix_path() -> None:
    pattern = compile_pattern("q_proj")
    assert isinstance(pattern, SuffixPattern) and pattern.literal == "q_proj"
