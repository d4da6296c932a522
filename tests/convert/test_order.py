"""The one conversion order: every option round-trips through the `convert` command line and through the JSON
the app sends its child; a document of another version is refused."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from inspector.cli.main import build_parser
from inspector.convert.kinds import Request, names
from inspector.convert.options import ConvertOptions
from inspector.convert.order import Order, check, from_args, from_json, to_argv, to_json
from inspector.errors import InspectorError

# option values as a shell would pass them: no NUL, and not starting with "-" where argparse would take
# a value for a flag
text = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), min_size=1, max_size=12)
value = text.filter(lambda v: not v.startswith("-"))
names_ = st.lists(text, max_size=3).map(tuple)

options = st.builds(
    ConvertOptions,
    dtype=st.sampled_from(["auto", "fp32", "bf16", "fp16"]),
    shard_size=st.integers(1, 10**13),
    include=names_,
    exclude=names_,
    strip_prefix=names_,
    renames=st.lists(st.tuples(text.filter(lambda p: "=" not in p), st.text(max_size=8)), max_size=3).map(tuple),
    keep_fp32=names_,
    exclude_frozen=st.booleans(),
    exclude_buffers=st.booleans(),
    dedupe_tied=st.booleans(),
    source=st.sampled_from(["masters", "module"]),
)


@st.composite
def orders(draw: st.DrawFn) -> Order:
    kind = draw(st.sampled_from(names()))
    executor = draw(st.sampled_from(["local", "ray"]))
    part = draw(st.none() | st.integers(1, 9).flatmap(lambda n: st.tuples(st.integers(0, n - 1), st.just(n))))
    return Order(
        path=draw(value),
        out=draw(value),
        kind=kind,
        tag=draw(st.none() | value),
        request=Request(
            options=draw(options),
            base=draw(st.none() | value) if kind == "merged" else None,
            allow_damaged=draw(st.booleans()),
        ),
        overwrite=draw(st.booleans()),
        fsync=draw(st.booleans()),
        staging=draw(st.none() | value),
        part=part if executor == "local" else None,
        executor=executor,
        ray_address=draw(st.none() | value) if executor == "ray" else None,
        parts=draw(st.none() | st.integers(1, 64)) if executor == "ray" else None,
    )


@settings(max_examples=300, deadline=None)
@given(orders())
def test_every_option_round_trips_through_the_command_line(order: Order) -> None:
    args = build_parser().parse_args(to_argv(order))
    assert from_args(args) == order


@settings(max_examples=100, deadline=None)
@given(orders())
def test_the_order_round_trips_through_json(order: Order) -> None:
    assert from_json(to_json(order)) == order


def test_an_order_of_another_version_is_refused() -> None:
    doc = to_json(Order("/c", "/o")).replace('"version": 1', '"version": 99')
    with pytest.raises(InspectorError, match="not one this version reads"):
        from_json(doc)
    with pytest.raises(InspectorError):
        from_json('{"version": 1, "order": {"path": "/c"}}')


# -- the app's own channel is input too (#38 C.3) ------------------------------------------------------------


def _doc(**changes: object) -> dict:
    """A valid order document with `changes` at dotted paths (`order.request.options.workers`)."""
    doc = json.loads(to_json(Order("/c", "/o")))
    for path, value in changes.items():
        *parents, last = path.split("__")
        node = doc
        for key in parents:
            node = node[key]
        node[last] = value
    return doc


ATTACKS = {
    "workers as text": _doc(order__request__options__workers="3"),
    "workers out of range": _doc(order__request__options__workers=0),
    "part of three numbers": _doc(order__part=[0, 1, 2]),
    "part past its count": _doc(order__part=[5, 2]),
    "part of text": _doc(order__part=["0", "2"]),
    "an include that is a number": _doc(order__request__options__include=[123]),
    "renames of numbers": _doc(order__request__options__renames=[[1, 2]]),
    "shard size as text": _doc(order__request__options__shard_size="5GB"),
    "shard size zero": _doc(order__request__options__shard_size=0),
    "a flag that is a number": _doc(order__overwrite=1),
    "an unknown field": _doc(order__request__options__evil=1),
    "an unknown kind": _doc(order__kind="pickle"),
    "an unknown executor": _doc(order__executor="fork"),
    "an unknown dtype": _doc(order__request__options__dtype="int4"),
    "an unknown source": _doc(order__request__options__source="optimizer"),
    "a rename pattern with =": _doc(order__request__options__renames=[["a=b", "c"]]),
    "a base for a kind without one": _doc(order__request__base="/b"),
    "part and ray at once": _doc(order__part=[0, 2], order__executor="ray"),
    "a bad TP-split rule": _doc(order__tp_split=[["*", "7"]]),
    "options that are a list": _doc(order__request__options=[]),
    "the order a string": _doc(order="x"),
}


@pytest.mark.parametrize("doc", ATTACKS.values(), ids=ATTACKS.keys())
def test_a_wrong_type_or_range_in_the_order_is_one_clear_refusal(doc: dict) -> None:
    with pytest.raises(InspectorError, match=r"not one this version reads|--|Unknown output") as err:
        from_json(json.dumps(doc))
    assert err.value.title == "Invalid option"


@pytest.mark.parametrize(
    "text",
    [
        "[" * 100_000 + "]" * 100_000,
        '{"a":' * 100_000 + "1" + "}" * 100_000,
        "x" * ((1 << 20) + 1),
        "NaN",
        "",
    ],
    ids=["deep list", "deep object", "too long", "NaN", "empty"],
)
def test_a_document_too_deep_or_large_is_refused_before_it_is_decoded(text: str) -> None:
    with pytest.raises(InspectorError, match="not one this version reads"):
        from_json(text)


def test_brackets_inside_strings_are_not_nesting() -> None:
    order = Order("/c[[[[[[[[[[", '/o"{{{{{{{{{{{\\')
    assert from_json(to_json(order)) == order


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(10**20), 10**20) | st.floats() | st.text(max_size=6),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=6,
)


def _paths(doc: object, prefix: tuple = ()) -> list[tuple]:
    if isinstance(doc, dict):
        return [prefix] + [p for k, v in doc.items() for p in _paths(v, (*prefix, k))]
    return [prefix]


@settings(max_examples=300, deadline=None)
@given(st.data(), orders())
def test_any_value_anywhere_gives_an_order_that_passes_the_checks_or_one_refusal(
    data: st.DataObject, order: Order
) -> None:
    """Whatever a field holds, the reader answers with a checked Order or an InspectorError: never another
    exception (a TypeError, a RecursionError) and never an order the command line would refuse."""
    doc = json.loads(to_json(order))
    path = data.draw(st.sampled_from(_paths(doc)[1:]))
    node = doc
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = data.draw(json_values)
    try:
        got = from_json(json.dumps(doc))
    except InspectorError:
        return
    assert check(got) == got


def test_the_child_refuses_a_bad_order_with_exit_2_and_no_traceback(tmp_path: Path) -> None:
    doc = _doc(order__part=[5, 2], order__path=str(tmp_path / "c"), order__out=str(tmp_path / "o"))
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[2]))
    argv = [
        sys.executable,
        "-m",
        "inspector",
        "convert",
        str(tmp_path / "c"),
        str(tmp_path / "o"),
        "--order",
        "-",
    ]
    run = subprocess.run(argv, input=json.dumps(doc), capture_output=True, text=True, env=env)
    assert run.returncode == 2 and "Traceback" not in run.stderr, run.stderr
    assert "--part '5/2' is not I/N" in run.stderr
