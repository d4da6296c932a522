"""parse/layers: universal_checkpoint_info's sub-parameter records, read as DeepSpeed 0.19.8 writes them
(AutoTP's `parameter_with_sub_params` dicts, UCP 0.4's `sub_param_shard_widths`, the older count form), and
refused field by field when damaged."""

from __future__ import annotations

from typing import Any

import pytest

from inspector.errors import InputError
from inspector.parse.layers import SubParams, TpRecipe

QKV = "^model\\.layers\\.0\\.self_attn\\.qkv_proj\\.weight$"


def _info(**extra: object) -> dict[str, object]:
    return {"universal_checkpoint_info": {"universal_checkpoint_version": 0.4, **extra}}


def test_autotp_sub_parameters_with_their_widths() -> None:
    recipe = TpRecipe.parse(
        _info(
            parameter_with_sub_params=[{"patterns": [QKV], "shape": [(16, 16, 16), -1], "partition_dim": 0}],
            sub_param_shard_widths={QKV: [[8, 8], [8, 8], [8, 8]]},
        ),
        "f",
    )
    assert recipe is not None and recipe.version == 0.4
    name = "model.layers.0.self_attn.qkv_proj.weight"
    assert recipe.rules[name] == "sub-params"
    assert recipe.sub_params[name] == SubParams(0, (16, 16, 16), None, ((8, 8), (8, 8), (8, 8)))


def test_the_older_count_form_and_a_regex_pattern() -> None:
    recipe = TpRecipe.parse(
        _info(parameter_with_sub_params=[{"patterns": [QKV, "qkv.*"], "shape": [3, -1], "partition_dim": 0}]),
        "f",
    )
    assert recipe is not None and recipe.regex == ("qkv.*",)
    assert recipe.sub_params["model.layers.0.self_attn.qkv_proj.weight"] == SubParams(0, None, 3, None)


@pytest.mark.parametrize(
    ("entry", "field"),
    [
        ({"patterns": [QKV], "shape": [3, -1], "partition_dim": 2}, "shape"),
        ({"patterns": [QKV], "shape": [1000, -1], "partition_dim": 0}, "shape"),
        ({"patterns": QKV, "shape": [3, -1], "partition_dim": 0}, "patterns"),
    ],
)
def test_a_damaged_entry_is_refused_naming_its_field(entry: dict[str, object], field: str) -> None:
    with pytest.raises(InputError, match=field):
        TpRecipe.parse(_info(parameter_with_sub_params=[entry]), "f")


def _whole(shape: list[int]) -> dict[str, Any]:
    """DeepSpeed's `replicated_map(shape, 2).to_dict()`."""
    strides = [4, 1][-len(shape) :]
    piece = {"shape": shape, "source": [0, strides], "dest": [0, strides], "locations": [0, 1]}
    return {"logical_shape": shape, "ranks": {r: {"shard_shape": shape, "pieces": [piece]} for r in (0, 1)}}


def test_the_entry_as_recorded_and_the_affine_maps_names() -> None:
    """What a universal file's `sub_param_shape` repeats (every pattern of the entry, the shape with its sizes
    as a tuple, list or tuple as pickled) and the parameters an affine map covers (a regex kept apart)."""
    recipe = TpRecipe.parse(
        _info(
            parameter_with_sub_params=[
                {"patterns": [QKV, "qkv.*"], "shape": [(16, 16, 16), -1], "partition_dim": 0}
            ],
            sub_param_shard_widths={QKV: [[8, 8], [8, 8], [8, 8]]},
            affine_map={"version": 1, "params": {QKV: _whole([48, 4]), "^norm$": _whole([4]), "o_.*": {}}},
        ),
        "f",
    )
    assert recipe is not None
    sub = recipe.sub_params["model.layers.0.self_attn.qkv_proj.weight"]
    assert (sub.patterns, sub.shape, sub.shape_listed) == ((QKV, "qkv.*"), ((16, 16, 16), -1), True)
    assert recipe.affine == {"model.layers.0.self_attn.qkv_proj.weight", "norm"}
    assert recipe.affine_regex == ("o_.*",) and recipe.affine_version == 1
    assert recipe.maps["norm"].logical == (4,) and recipe.maps["norm"].shards == ((4,), (4,))
    assert TpRecipe.parse(_info(), "f").affine == frozenset()  # type: ignore[union-attr]
