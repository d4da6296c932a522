"""Pipeline x tensor-parallel checkpoints (layer_XX-model_TT files: a PipelineModule over a
PipeModelDataParallelTopology(num_pp=2, num_mp=2, num_dp=1), its layers column- and row-parallel by hand, as
GPT-NeoX and Megatron-DeepSpeed write them) saved by real DeepSpeed 0.19.8: each tensor-parallel rank's
pipeline rebuilt, the shards joined by the recorded split (or --tp-split), bit-exact with the live engines."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import torch

from inspector.remote.roots import source_at
from inspector.scan.layouts.pipeline.scanner import Pipeline
from inspector.scan.locate import locate
from inspector.scan.model import Kind
from inspector.scan.scanner import scan
from tests.scan.layout_cases import (
    assert_exact,
    ckpt_dir,
    convert,
    expected,
    flip_bit,
    scan_without,
    writable,
)

NAME = "pptp_z1_bf16"
TAG = "global_step3"
SPLIT = (("3.weight", "1"), ("1.*", "0"), ("*", "replicated"))  # what make_pipe_tp.py's layers do


def test_pipeline_tensor_parallel_converts_bit_exact(tmp_path: Path) -> None:
    ckpt = scan(str(ckpt_dir(NAME)))
    assert not ckpt.errors, ckpt.errors
    assert ckpt.parallel is not None
    assert (ckpt.parallel.kind, ckpt.parallel.pp, ckpt.parallel.tp, ckpt.parallel.dp) == ("pipeline", 2, 2, 1)
    assert ckpt.world_size == 4 and [r.rank for r in ckpt.ranks] == [0, 1, 2, 3]
    assert (
        ckpt.parallel.words == "pipeline parallel: 2 stages × 2 tensor-parallel shards × 1 data-parallel rank"
    )
    assert ckpt.tensor("1.weight").shape == (32, 16)  # column-parallel: shards stacked on dim 0
    assert ckpt.tensor("3.weight").shape == (16, 32)  # row-parallel: side by side on dim 1
    assert ckpt.tensor("5.weight").shape == (37, 16)  # replicated: one copy
    assert all(t.kind is Kind.TRAINABLE and t.module_copy for t in ckpt.tensors)
    assert_exact(ckpt, NAME, tmp_path)


def _drop_record(root: Path) -> None:
    path = root / TAG / "mp_rank_00_model_states.pt"
    sd = torch.load(path, weights_only=False)
    del sd["universal_checkpoint_info"]
    torch.save(sd, path)


def test_without_a_record_the_split_is_refused_until_the_user_states_it(tmp_path: Path, cli) -> None:  # type: ignore[no-untyped-def]
    """A pipeline's layers carry no split of their own: without universal_checkpoint_info the scan says what
    is missing; with --tp-split the join equals the live engines'."""
    root = writable(NAME, tmp_path / "ck")
    _drop_record(root)
    refused = scan(str(root))
    assert [f.code for f in refused.errors] == ["tp-unrecorded"] and not refused.tensors
    assert "--tp-split" in refused.errors[0].hint
    ckpt = scan(str(root), tp_split=SPLIT)
    assert not ckpt.errors, ckpt.errors
    fp32 = convert(ckpt, tmp_path / "fp32", "fp32")
    for n, v in expected(NAME).items():
        if n.startswith("fp32/"):
            assert np.array_equal(fp32[n[5:]].view(np.uint32), v.view(np.uint32)), n
    args = [a for glob, rule in SPLIT for a in ("--tp-split", f"{glob}={rule}")]
    assert cli("convert", root, tmp_path / "out", "--format", "weights", "--dtype", "fp32", *args).rc == 0
    assert cli("verify", root, tmp_path / "out", *args).rc == 0
    refused = cli("scan", root)
    assert refused.rc != 0 and "--tp-split" in refused.stdout + refused.stderr


def test_a_missing_tensor_parallel_shard_is_named(tmp_path: Path) -> None:
    root = writable(NAME, tmp_path / "ck")
    for n in os.listdir(root / TAG):
        if "-model_01-" in n:
            os.remove(root / TAG / n)
    ckpt = scan(str(root))
    assert any(f.code == "missing-shard" and "tensor-parallel rank 1" in f.message for f in ckpt.errors)
    assert not ckpt.tensors


def test_a_missing_stage_of_one_shard_is_named(tmp_path: Path) -> None:
    """Stage 1 of tensor-parallel rank 1 is mp_rank_03 (stage x tp + rank)."""
    ckpt = scan_without(NAME, tmp_path, "mp_rank_03_model_states.pt")
    codes = {f.code for f in ckpt.errors}
    assert "missing-stage" in codes, ckpt.errors
    assert any("mp_rank_03" in f.message for f in ckpt.errors)
    assert not [t for t in ckpt.tensors if t.kind is Kind.TRAINABLE]


def test_a_replicated_parameter_that_differs_between_shards_is_an_error(tmp_path: Path) -> None:
    root = writable(NAME, tmp_path / "ck")
    loc = locate(str(root), None, source_at(str(root), "checkpoint"))
    shard1 = Pipeline(loc, 1, 2).build()  # tensor-parallel rank 1's pipeline alone
    seg = shard1.tensor("5.bias").segments[0]
    flip_bit(seg.file, seg.offset)  # one bit of its fp32 master flipped
    ckpt = scan(str(root))
    assert any(f.code == "tp-mismatch" and "5.bias" in f.message for f in ckpt.errors), ckpt.errors


def test_a_missing_layer_file_of_one_shard_is_named(tmp_path: Path) -> None:
    ckpt = scan_without(NAME, tmp_path, "layer_03-model_01-model_states.pt")
    assert [f.code for f in ckpt.errors] == ["missing-layer"]
    assert "layer_03-model_01-model_states.pt" in ckpt.errors[0].message


def test_a_lost_first_stage_of_another_shard_is_a_finding(tmp_path: Path) -> None:
    """mp_rank_01 is tensor-parallel rank 1's first stage: the folder is still scanned, the loss named."""
    ckpt = scan_without(NAME, tmp_path, "mp_rank_01_model_states.pt")
    assert [f.code for f in ckpt.errors] == ["missing-shard"]
    assert (
        ckpt.errors[0].message.startswith("Tensor-parallel rank 1:")
        and "mp_rank_01" in ckpt.errors[0].message
    )
    assert not ckpt.tensors


def test_a_model_axis_of_one_rank_reads_as_a_plain_pipeline(tmp_path: Path) -> None:
    """A PipeModelDataParallelTopology with num_mp=1 names its layer files layer_XX-model_00-…: the same
    pipeline as layer_XX-…, read the same (it was refused as pipeline x tensor parallel before)."""
    root = writable("pp_z1_bf16", tmp_path / "ck")
    for n in os.listdir(root / TAG):
        if n.startswith("layer_"):
            os.rename(root / TAG / n, root / TAG / n.replace("-model_states", "-model_00-model_states"))
    ckpt = scan(str(root))
    assert not ckpt.errors and ckpt.parallel is not None and ckpt.parallel.tp == 1
    assert_exact(ckpt, "pp_z1_bf16", tmp_path)
