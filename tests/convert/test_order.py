"""The one conversion order: every option round-trips through the `convert` command line and through the JSON
the app sends its child; a document of another version is refused."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from inspector.cli.main import build_parser
from inspector.convert.kinds import Request, names
from inspector.convert.options import ConvertOptions
from inspector.convert.order import Order, from_args, from_json, to_argv, to_json
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
