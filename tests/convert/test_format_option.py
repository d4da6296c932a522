"""`--format KIND` names the five output kinds; today's flags stay as aliases, and two kinds at once are refused."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from inspector.convert.kinds import names
from inspector.convert.order import kind_from_args as apply_format
from inspector.demo.writer import DemoSpec
from inspector.errors import InspectorError

if TYPE_CHECKING:
    from conftest import CliResult, DemoCache

SPEC = DemoSpec(stage=2, world_size=2, dtype="bf16", params=50_000)


def _args(fmt: str | None, **flags: bool) -> argparse.Namespace:
    base = {"weights_only": False, "adapter": False, "merge_adapter": False}
    return argparse.Namespace(format=fmt, **{**base, **flags})


@pytest.mark.parametrize(
    ("fmt", "flags", "want"),
    [
        ("model", {}, "model"),
        ("safetensors", {}, "model"),
        (None, {}, "model"),
        ("weights", {}, "weights"),
        ("adapter", {}, "adapter"),
        ("merged", {}, "merged"),
        ("universal", {}, "universal"),
        ("model", {"weights_only": True}, "weights"),  # the old flags, as aliases
        ("safetensors", {"merge_adapter": True}, "merged"),
        ("adapter", {"adapter": True}, "adapter"),  # the same kind twice is one kind
    ],
)
def test_format_names_the_kind(fmt: str | None, flags: dict[str, bool], want: str) -> None:
    args = _args(fmt, **flags)
    assert apply_format(args) == want


def test_an_unknown_kind_is_named_with_the_choices() -> None:
    with pytest.raises(InspectorError, match="Unknown output kind 'safetensor'") as err:
        apply_format(_args("safetensor"))
    assert "weights, model, adapter, merged, universal" in err.value.hint


@pytest.mark.parametrize(
    ("fmt", "flags"),
    [
        ("universal", {"adapter": True}),
        ("weights", {"merge_adapter": True}),
        ("model", {"adapter": True, "merge_adapter": True}),
        ("adapter", {"weights_only": True}),
    ],
)
def test_two_kinds_at_once_are_refused(fmt: str, flags: dict[str, bool]) -> None:
    with pytest.raises(InspectorError, match="more than one output kind"):
        apply_format(_args(fmt, **flags))


def test_every_kind_is_a_format_choice() -> None:
    assert set(names()) == {"model", "weights", "adapter", "merged", "universal"}


@pytest.mark.parametrize(
    ("new", "old"), [("weights", "--weights-only"), ("universal", None), ("model", None)]
)
def test_preflight_answers_the_same_for_a_kind_and_its_alias(
    tmp_path: Path, demo: DemoCache, cli: Callable[..., CliResult], new: str, old: str | None
) -> None:
    root = demo(SPEC)
    by_kind = cli("preflight", root, "--format", new, "--out", tmp_path, "--json")
    alias = ("--format", "universal") if new == "universal" else ((old,) if old else ())
    by_alias = cli("preflight", root, *alias, "--out", tmp_path, "--json")
    assert by_kind.rc == by_alias.rc == 0, by_kind.stderr + by_alias.stderr
    a, b = json.loads(by_kind.stdout), json.loads(by_alias.stdout)
    stable = ("output_kind", "format", "output_bytes", "predicted_peak_rss_bytes", "read_bytes", "fits")
    assert {k: a.get(k) for k in stable} == {k: b.get(k) for k in stable}  # not the machine's free RAM/disk
    assert a.keys() == b.keys()
    assert a["output_kind"] in {"weights", "model", "universal"}


def test_convert_refuses_two_kinds(tmp_path: Path, demo: DemoCache, cli: Callable[..., CliResult]) -> None:
    res = cli("convert", demo(SPEC), tmp_path / "out", "--format", "universal", "--adapter")
    assert res.rc == 2 and "more than one output kind" in res.stderr
    assert not (tmp_path / "out").exists()  # refused before anything is written
