"""The typed records of the input boundary, against the trees real checkpoints hold: any field replaced by a
value of the wrong type, sign or size is either accepted as valid or refused with the one InputError (which
names the file and field), never another exception; the layout built from accepted records is either built
or refused with an InspectorError."""

from __future__ import annotations

import copy
import glob
import os
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from inspector.demo.writer import DemoSpec
from inspector.errors import InputError, InspectorError
from inspector.format.torchzip import TensorRef, load_tree
from inspector.parse.states import ModelStates, OptimStates
from inspector.scan.layout import stage3_layout, stage12_layout

if TYPE_CHECKING:
    from conftest import DemoCache

SPECS = {
    2: DemoSpec(stage=2, world_size=2, dtype="bf16", params=20_000),
    3: DemoSpec(stage=3, world_size=2, dtype="bf16", params=20_000),
}
WRONG: list[Any] = [None, -1, 10**30, -(10**30), 1.5, float("inf"), float("nan"), "x", "", b"\x1b[2J", [], {}, (),
                    [1, 2], {"a": 1}, {1: 2}, frozenset({1}), True, "../../etc/passwd", "__metadata__", "\x1b]0;t\x07"]


def paths(tree: Any, prefix: tuple[Any, ...] = (), depth: int = 0) -> Iterator[tuple[Any, ...]]:
    """Every key path into dicts and lists (tensor references are leaves)."""
    if depth > 8:
        return
    if isinstance(tree, dict):
        for k, v in tree.items():
            yield (*prefix, k)
            yield from paths(v, (*prefix, k), depth + 1)
    elif isinstance(tree, list | tuple):
        for i, v in enumerate(tree[:8]):
            yield (*prefix, i)
            yield from paths(v, (*prefix, i), depth + 1)


def replaced(tree: Any, path: tuple[Any, ...], value: Any) -> Any:
    """A copy of `tree` with the value at `path` replaced (tuples rebuilt; tensor refs shared)."""
    if not path:
        return value
    head, rest = path[0], path[1:]
    if isinstance(tree, dict):
        out = copy.copy(tree)
        out[head] = replaced(tree[head], rest, value)
        return out
    items = list(tree)
    items[head] = replaced(items[head], rest, value)
    return type(tree)(items) if isinstance(tree, tuple) else items


@pytest.fixture(scope="module")
def trees(demo: DemoCache) -> dict[int, tuple[Any, list[Any], list[str]]]:
    out = {}
    for stage, spec in SPECS.items():
        tag = next(p for p in Path(demo(spec)).iterdir() if p.is_dir())
        model = sorted(glob.glob(str(tag / "*model_states.pt")))[0]
        optims = sorted(glob.glob(str(tag / "*optim_states.pt")))
        out[stage] = (load_tree(model), [load_tree(p) for p in optims], optims)
    return out


def build(stage: int, model: Any, optims: list[Any], names: list[str]) -> None:
    """What scan does with the trees: parse every file, then lay out the parameters."""
    ms = ModelStates.parse(model, "model.pt")
    states = [OptimStates.parse(t, os.path.basename(p), stage == 3) for t, p in zip(optims, names, strict=True)]
    if ms.param_shapes:
        (stage3_layout if stage == 3 else stage12_layout)(ms.param_shapes, states)


def test_real_trees_parse(trees: dict[int, tuple[Any, list[Any], list[str]]]) -> None:
    for stage, (model, optims, names) in trees.items():
        build(stage, model, optims, names)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_any_field_replaced_is_accepted_or_refused_with_the_one_error(
    trees: dict[int, tuple[Any, list[Any], list[str]]], data: st.DataObject
) -> None:
    stage = data.draw(st.sampled_from(sorted(trees)))
    model, optims, names = trees[stage]
    which = data.draw(st.integers(-1, len(optims) - 1))  # -1: the model states
    target = model if which < 0 else optims[which]
    path = data.draw(st.sampled_from(list(paths(target))))
    value = data.draw(st.sampled_from(WRONG))
    mutated = replaced(target, path, value)
    if which < 0:
        model = mutated
    else:
        optims = [mutated if i == which else t for i, t in enumerate(optims)]
    try:
        build(stage, model, optims, names)
    except InputError as exc:
        assert exc.file and exc.field  # names the file and the field
        assert "\x1b" not in str(exc)
    except InspectorError:
        pass  # the layout's own refusal (sizes that do not add up)


def test_type_confusions_from_the_attack_list_are_refused(
    trees: dict[int, tuple[Any, list[Any], list[str]]],
) -> None:
    """The issue's examples, each by name: every one an InputError naming its field."""
    model, optims, names = trees[2]
    cases = {
        ("shared_params",): ["a", "b"],
        ("buffer_names",): [["unhashable"]],
        ("param_shapes", 0): {"w": 5},
        ("frozen_param_shapes",): {"f": (-3, 2)},
        ("module",): ["not", "a", "dict"],
    }
    for path, value in cases.items():
        with pytest.raises(InputError) as err:
            ModelStates.parse(replaced(model, path, value), "model.pt")
        assert path[0] in err.value.field
    osd_cases = {
        ("optimizer_state_dict", "group_paddings"): ["3", "1"],
        ("optimizer_state_dict", "base_optimizer_state", "state"): [1, 2],
        ("optimizer_state_dict", "base_optimizer_state", "param_groups"): [1, 2],
        ("optimizer_state_dict", "param_alignment_paddings"): [[-5, 0]],
    }
    for path, value in osd_cases.items():
        with pytest.raises(InputError):
            OptimStates.parse(replaced(optims[0], path, value), names[0], False)


def test_huge_hyperparameters_become_json_safe(trees: dict[int, tuple[Any, list[Any], list[str]]]) -> None:
    """`lr=10**5000` crashed `scan --json`; the record keeps metadata JSON-safe."""
    import json

    _model, optims, names = trees[2]
    path = ("optimizer_state_dict", "base_optimizer_state", "param_groups", 0, "lr")
    st_ = OptimStates.parse(replaced(optims[0], path, 10**5000), names[0], False)
    json.dumps(dict(st_.groups[0].hyperparams), allow_nan=False)
    assert isinstance(st_.groups[0].master, TensorRef)


def test_a_sub_tree_shared_by_rank_trees_is_read_once_and_refused_for_each_file() -> None:
    """`tree.once`: rank trees rebuilt from one pickle share their tensor-free sub-trees; the record read
    from one is the record of all (the same object), and a bad one is refused naming each file in turn."""
    from inspector.parse.dsconfig import DsConfig
    from inspector.parse.tree import Node, once

    raw = {"zero_optimization": {"stage": 3}, "bf16": {"enabled": True}}
    a = once(DsConfig.parse, Node(raw, "rank0.pt", "ds_config"))
    b = once(DsConfig.parse, Node(raw, "rank1.pt", "ds_config"))
    assert a is b and a.zero_stage == 3 and a.bf16
    assert once(DsConfig.parse, Node(dict(raw), "rank2.pt", "ds_config")) == a  # another object: read again
    from inspector.parse.states import _param_shapes

    bad = [{"a.weight": (2, 3)}, {"a.weight": (2, 3)}]  # one name in two groups
    for f in ("rank0.pt", "rank1.pt"):
        with pytest.raises(InputError, match=f):
            once(_param_shapes, Node(bad, f, "param_shapes"))
