"""Issue 38 (trust): the records of how a tensor-parallel checkpoint is split, rewritten in the real AutoTP
fixtures. The affine map joins what it covers, as DeepSpeed's ds_to_universal does; a map that disagrees
with a category list or with the stored shard shapes, a scaled piece, is an error finding and no tensor."""

from __future__ import annotations

import glob
from pathlib import Path
from typing import Any

import pytest
import torch

from inspector.scan.scanner import scan
from tests.scan.layout_cases import assert_exact, writable

CATEGORY_KEYS = (
    "tp_replicated_parameter_patterns",
    "parameter_with_row_parallelism_patterns",
    "vocabulary_parameter_patterns",
    "parameter_with_sub_params",
    "sub_param_shard_widths",
    "parameter_with_2_sub_params_cat_dim_0",
)
DOWN = "model.layers.0.mlp.down_proj.weight"
EMBED = "model.embed_tokens.weight"


def _pattern(name: str) -> str:
    return "^" + name.replace(".", "\\.") + "$"


def _rewrite(root: Path, edit: Any) -> None:
    """Every shard's model states rewritten alike (each carries its own universal_checkpoint_info)."""
    for path in glob.glob(str(root / "global_step3" / "*model_states.pt")):
        sd = torch.load(path, weights_only=False)
        edit(sd["universal_checkpoint_info"])
        torch.save(sd, path)


def _map_only(info: dict[str, Any]) -> None:
    for key in CATEGORY_KEYS:
        info.pop(key, None)


@pytest.mark.parametrize("name", ["tp_z1_bf16", "tp_phi3_z1_bf16", "tp_z3_bf16_dp2"])
def test_a_checkpoint_recording_its_split_only_as_an_affine_map_joins_exactly(
    name: str, tmp_path: Path
) -> None:
    """No category lists, only the map (row-parallel, replicated, vocabulary and fused sub-parameters alike):
    every tensor equals the live engine's, bit for bit, as ds_to_universal rebuilds them from the map."""
    root = writable(name, tmp_path / "ck")
    _rewrite(root, _map_only)
    ckpt = scan(str(root))
    assert not ckpt.errors, ckpt.errors
    assert ckpt.tensor(DOWN).shape == (16, 24) and ckpt.tensor(EMBED).shape[0] == 40
    assert_exact(ckpt, name, tmp_path)


def _row_called_replicated(info: dict[str, Any]) -> None:
    info["parameter_with_row_parallelism_patterns"].remove(_pattern(DOWN))
    info["tp_replicated_parameter_patterns"].append(_pattern(DOWN))


def _maps_swapped(info: dict[str, Any]) -> None:
    params = info["affine_map"]["params"]
    q, o = (
        _pattern("model.layers.0.self_attn.q_proj.weight"),
        _pattern("model.layers.0.self_attn.o_proj.weight"),
    )
    params[q], params[o] = params[o], params[q]


@pytest.mark.parametrize(
    ("edit", "code", "name", "words"),
    [
        (_row_called_replicated, "tp-records-disagree", DOWN, "affine map and its replicated rule disagree"),
        (
            _maps_swapped,
            "tp-records-disagree",
            "model.layers.0.self_attn.q_proj.weight",
            "the model states record",
        ),
    ],
)
def test_records_that_disagree_are_refused(
    edit: Any, code: str, name: str, words: str, tmp_path: Path
) -> None:
    """A category list that says otherwise than the map, or a map whose shards are not the stored ones: an
    error finding naming the parameter and the records, the tensor left out, the conversion refused."""
    root = writable("tp_z1_bf16", tmp_path / "ck")
    _rewrite(root, edit)
    ckpt = scan(str(root))
    mine = [f for f in ckpt.errors if name in f.message]
    assert mine and {f.code for f in mine} == {code} and words in mine[0].message, ckpt.errors
    assert name not in {t.name for t in ckpt.tensors}


def test_a_scaled_piece_is_refused_not_written_as_stored(tmp_path: Path, cli: Any) -> None:
    """A piece held at scale 0.5 (shard = full x 0.5): DeepSpeed's converter divides the weights by it and
    refuses to carry the moments through it (`ParamAffineMap.rebuild`); the stored values are not the
    weights, so the scan refuses the tensor and convert exits non-zero."""
    root = writable("tp_z1_bf16", tmp_path / "ck")

    def halve(info: dict[str, Any]) -> None:
        for rank in info["affine_map"]["params"][_pattern(EMBED)]["ranks"].values():
            rank["pieces"][0]["scale"] = 0.5

    _rewrite(root, halve)
    ckpt = scan(str(root))
    assert [f.code for f in ckpt.errors] == ["tp-scaled"] and "scale 0.5" in ckpt.errors[0].message
    assert EMBED not in {t.name for t in ckpt.tensors}
    res = cli("convert", root, tmp_path / "out")
    assert res.rc != 0 and "Traceback" not in res.output


def test_shards_whose_own_records_disagree_are_refused(tmp_path: Path) -> None:
    """Each shard's model states carry the whole split; shard 1's saying otherwise than shard 0's is an error
    finding naming its file, and nothing is joined."""
    root = writable("tp_z1_bf16", tmp_path / "ck")
    path = root / "global_step3" / "mp_rank_01_model_states.pt"
    sd = torch.load(path, weights_only=False)
    _row_called_replicated(sd["universal_checkpoint_info"])
    torch.save(sd, path)
    ckpt = scan(str(root))
    assert [f.code for f in ckpt.errors] == ["tp-records-disagree"] and not ckpt.tensors
    assert "mp_rank_01_model_states.pt" in ckpt.errors[0].message


def test_a_million_row_parallel_rows_scan_as_records_not_segments() -> None:
    """Issue 38's memory attack at the join the scan runs: a 1,048,576 x 1 row-parallel shard pair with fp32
    masters, both moments and the bf16 module copy. Each joins to one `Strided` record (the old join made
    one Segment per row per shard: 2,097,152 objects for each of the four)."""
    from inspector.parse.layers import TpRecipe
    from inspector.scan.layouts.tensor.scanner import _joined
    from inspector.scan.model import Kind, Runs, Segment, TensorInfo

    rows = 1 << 20

    def piece(t: int) -> TensorInfo:
        def seg(kind: str, dtype: str = "float32") -> tuple[Segment, ...]:
            return (Segment(f"{kind}{t}", 64, rows, dtype),)

        moments = (("exp_avg", seg("m")), ("exp_avg_sq", seg("v")))
        return TensorInfo(
            "w", (rows, 1), "float32", Kind.TRAINABLE, seg("p"), None, 0, moments, seg("c", "bfloat16")
        )

    recipe = TpRecipe("f", {"w": "row"}, frozenset(), None, ())
    joined = _joined(piece(0), [piece(0), piece(1)], "row", recipe, None)  # type: ignore[arg-type]
    assert joined.shape == (rows, 2)
    for segs in (joined.segments, joined.module_copy, *(m for _, m in joined.moments)):
        assert isinstance(segs, Runs) and len(segs.blocks) == 1 and len(segs) == 2 * rows
    assert joined.module_copy[3] == Segment("c1", 64 + 2, 1, "bfloat16")
    assert joined.segments[2 * rows - 2] == Segment("p0", 64 + 4 * (rows - 1), 1, "float32")
