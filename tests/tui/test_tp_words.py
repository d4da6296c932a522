"""The detail panel's words for a tensor-parallel parameter (issue 42 polish): a ZeRO-3 TP tensor names its
TP shards, the split dim and its data-parallel ranks, not "Partitioned 4 ways"; a replicated one says so."""

from __future__ import annotations

from inspector.scan.scanner import scan
from inspector.tui.widgets.tensor_detail import padding_note
from tests.scan.layout_cases import ckpt_dir


def test_zero3_tp_names_shards_split_dim_and_dp_ranks() -> None:
    ckpt = scan(str(ckpt_dir("tp_z3_bf16_dp2")))
    assert ckpt.stage == 3 and ckpt.parallel is not None and (ckpt.parallel.tp, ckpt.parallel.dp) == (2, 2)
    q = padding_note(ckpt, ckpt.tensor("model.layers.0.self_attn.q_proj.weight"))  # 16x16, column parallel
    assert q.startswith("2 tensor-parallel shards, split on dim 0;") and "2 data-parallel ranks" in q, q
    assert "64 per rank" in q and "ways" not in q  # 256 elements / 2 shards / 2 ranks
    o = padding_note(ckpt, ckpt.tensor("model.layers.0.self_attn.o_proj.weight"))  # row parallel: strided
    assert "split on dim 1" in o and "64 per rank" in o, o
    norm = padding_note(ckpt, ckpt.tensor("model.norm.weight"))
    assert norm.startswith("Replicated on the 2 tensor-parallel shards"), norm


def test_zero1_tp_says_the_split_and_replicated_ones() -> None:
    ckpt = scan(str(ckpt_dir("tp_z1_bf16")))
    q = padding_note(ckpt, ckpt.tensor("model.layers.0.self_attn.q_proj.weight"))
    assert q.startswith("Joined from 2 tensor-parallel shards (split on dim 0);"), q
    norm = padding_note(ckpt, ckpt.tensor("model.norm.weight"))
    assert norm.startswith("Replicated on the 2 tensor-parallel shards") and "Joined" not in norm, norm
