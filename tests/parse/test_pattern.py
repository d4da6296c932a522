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

from inspector.parse.pattern import MAX_SET_STATES, PatternError, PatternSet, SuffixPattern, compile_pattern
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


# -- #38 C.4: nesting, digits, and one budget for all keys -----------------------------------------------------


@pytest.mark.parametrize("depth", [200, 100_000])
def test_nesting_costs_stack_entries_not_frames(depth: int) -> None:
    for key in ("(" * depth + "q" + ")" * depth + "_proj", "(?:" * depth + "q|k" + ")" * depth):
        pattern = compile_pattern(key)
        assert pattern.matches("model.layers.0.q_proj" if key.endswith("_proj") else "a.k")


@pytest.mark.parametrize("key", ["a{²}", "a{1,³}", "a{١}", "a{1,٢}", "a{-1}", "a{1,2,3}"])
def test_a_repeat_count_is_ascii_digits_only(key: str) -> None:
    with pytest.raises(PatternError, match="repeat count"):
        compile_pattern(key)


_SET_KEYS = st.lists(_KEYS | st.sampled_from(["a", "b.a", "1", "a_b"]), min_size=1, max_size=5)


@settings(max_examples=300, deadline=None)
@given(keys=_SET_KEYS, names=st.lists(_NAMES, min_size=1, max_size=6))
def test_a_set_picks_the_key_peft_picks(keys: list[str], names: list[str]) -> None:
    """PEFT's get_pattern_key: the first key (in the config's order) whose regex matches the name's end."""
    table = PatternSet(keys)
    for name in names:
        want = next((i for i, k in enumerate(keys) if peft_matches(k, name)), None)
        assert table.first(name) == want, (keys, name)


def _heavy_keys(n: int) -> list[str]:
    """Distinct keys within every per-key limit (under 512 characters, under 4,096 states each)."""
    return [f"m{i}_" + "[a-z]{100}" * 6 for i in range(n)]


def test_many_heavy_keys_are_refused_once_past_the_budget_for_all() -> None:
    """3,000 such keys took over 512 MiB and 10 s each compiled alone; together they stop at the budget."""
    keys = _heavy_keys(3000)
    assert all(len(k) < 512 and len(compile_pattern(k).states) < 4096 for k in keys[:3])
    built: list[int] = []
    real_init = PatternSet.__init__

    def counting(self: PatternSet, *args: Any, **kw: Any) -> None:
        try:
            real_init(self, *args, **kw)
        finally:
            built.append(len(self.states))

    with pytest.raises(PatternError, match="keys together need more than"):
        PatternSet.__init__ = counting  # type: ignore[method-assign]
        try:
            PatternSet(keys)
        finally:
            PatternSet.__init__ = real_init  # type: ignore[method-assign]
    assert built and built[0] <= MAX_SET_STATES


def test_a_config_with_many_heavy_keys_is_one_clear_error(demo: Any, tmp_path: Path) -> None:
    from inspector.scan.json_view import adapter_json

    ckpt = lora_checkpoint(demo, tmp_path, rank_pattern=dict.fromkeys(_heavy_keys(3000), 8))
    info = adapter_json(ckpt)
    assert info is not None and "name the modules literally" in info["error"], info


@pytest.mark.parametrize("key", ["q{²}_proj", "(" * 200 + "q" + ")" * 200 + "_proj"])
def test_a_config_key_that_crashed_the_scan_is_answered(demo: Any, tmp_path: Path, key: str) -> None:
    from inspector.scan.json_view import adapter_json

    ckpt = lora_checkpoint(demo, tmp_path, rank_pattern={key: 4})
    info = adapter_json(ckpt)
    assert info is not None
    if "²" in key:
        assert "repeat count" in info["error"], info
    else:  # legal in Python's engine and in PEFT: matched like it
        assert {ly.r for ly in detect_adapter(ckpt).layers if ly.module.endswith("q_proj")} == {4}


def test_the_matching_work_over_all_names_has_a_budget(
    demo: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from inspector.parse import pattern
    from inspector.scan.peft import AdapterError

    ckpt = lora_checkpoint(demo, tmp_path, rank_pattern={"q_pr.j": 4, "x": 2})
    assert detect_adapter(ckpt) is not None
    monkeypatch.setattr(pattern, "MAX_SET_STEPS", 10)
    with pytest.raises(AdapterError, match="steps of matching"):
        detect_adapter(ckpt)


@settings(max_examples=150, deadline=None)
@given(keys=_SET_KEYS, names=st.lists(_NAMES, min_size=1, max_size=6))
def test_a_set_answers_as_peft_get_pattern_key(keys: list[str], names: list[str]) -> None:
    """The truth from PEFT itself (peft.utils.other.get_pattern_key, which returns the name when no key
    matches); distinct keys, as a JSON object's are."""
    other = pytest.importorskip("peft.utils.other")
    keys = list(dict.fromkeys(keys))
    table = PatternSet(keys)
    for name in names:
        i = table.first(name)
        picked = other.get_pattern_key(keys, name)
        assert (keys[i] if i is not None else name) == picked, (keys, name)
