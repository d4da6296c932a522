"""PyTorch Distributed Checkpoints: real folders made by torch 2.13 on the CPU (tests/fixtures/dcp/make_dcp.py)
scan and convert bit for bit to the live model's full state dict (`expected.npz`), and the folders this tool
cannot read, or that are damaged or crafted, are refused or reported in words."""

from __future__ import annotations

import json
import pickle
import shutil
import struct
from pathlib import Path

import numpy as np
import pytest

from inspector.cli.main import main
from inspector.errors import CorruptFileError, UnsafePickleError, UnsupportedCheckpointError
from inspector.format.dcpmeta import MetadataParser
from inspector.scan.layouts.dcp.items import refuse_transforms
from inspector.scan.layouts.dcp.placement import Chunk, TilingError, runs
from inspector.scan.model import Kind, Severity
from inspector.scan.scanner import scan

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "dcp"
CASES = sorted(p.name for p in FIXTURES.iterdir() if (p / "expected.npz").is_file())
_ST_DTYPES = {"F32": "float32", "BF16": "bfloat16", "I64": "int64", "F16": "float16"}


def _safetensors(out: Path) -> dict[str, tuple[str, bytes]]:
    """Every tensor of the safetensors files in `out`: (dtype, raw bytes), read without a library."""
    got = {}
    for f in sorted(out.glob("*.safetensors")):
        raw = f.read_bytes()
        (n,) = struct.unpack("<Q", raw[:8])
        header = json.loads(raw[8 : 8 + n])
        for name, info in header.items():
            if name == "__metadata__":
                continue
            lo, hi = info["data_offsets"]
            got[name] = (_ST_DTYPES[info["dtype"]], raw[8 + n + lo : 8 + n + hi])
    return got


def _expected(case: str) -> dict[str, tuple[str, bytes]]:
    exp = np.load(FIXTURES / case / "expected.npz")
    dtypes = json.loads(bytes(exp["__dtypes__"]).decode())
    return {k: (dtypes[k], exp[k].tobytes()) for k in dtypes}


def test_every_saver_and_layout_has_a_fixture() -> None:
    assert set(CASES) >= {
        "fsdp2_fp32", "fsdp2_bf16", "mixed_tied", "uneven3", "fsdp1_sharded", "hsdp", "tp_fsdp",
        "titan_periodic", "titan_final", "accelerate_fsdp1", "accelerate_fsdp2", "lightning", "zstd",
    }  # fmt: skip


@pytest.mark.parametrize("case", CASES)
def test_converts_bit_exact_to_the_full_state_dict(case: str, tmp_path: Path) -> None:
    assert main(["convert", str(FIXTURES / case), str(tmp_path / "out")]) == 0
    got, want = _safetensors(tmp_path / "out"), _expected(case)
    assert sorted(got) == sorted(want)
    assert [k for k in want if got[k] != want[k]] == []


@pytest.mark.parametrize("case", CASES)
def test_scan_finds_model_optimizer_and_saver(case: str) -> None:
    ckpt = scan(str(FIXTURES / case))
    assert ckpt.errors == ()
    assert ckpt.layout == "dcp-" + {
        "titan": "torchtitan",
        "accelerate": "accelerate",
        "lightning": "lightning",
    }.get(case.split("_")[0], "torch")
    trainable = [t for t in ckpt.tensors if t.kind is Kind.TRAINABLE]
    if case == "titan_final":  # weights only, integer buffers cast to bf16 too: nothing tells them apart
        assert all(not t.moments for t in ckpt.tensors) and ckpt.compute_dtype == "bfloat16"
        return
    assert ckpt.tensor("positions").kind is Kind.BUFFER
    assert trainable and all({n for n, _ in t.moments} == {"exp_avg", "exp_avg_sq"} for t in trainable)
    assert ckpt.optimizer_step == 2
    assert ckpt.world_size == (4 if case in ("hsdp", "tp_fsdp") else 3 if case == "uneven3" else 2)


def test_tied_weights_stored_twice_are_one_parameter_and_its_alias() -> None:
    """Stored twice, one optimizer entry: the name without one is the other's TIED alias (equal bytes)."""
    ckpt = scan(str(FIXTURES / "mixed_tied"))
    emb, head = ckpt.tensor("emb.weight"), ckpt.tensor("head.weight")
    assert (emb.kind, head.kind, head.alias_of) == (Kind.TRAINABLE, Kind.TIED, "emb.weight")
    assert head.segments == emb.segments and head.moments == emb.moments
    assert [t.name for t in ckpt.tensors if t.kind is Kind.FROZEN] == []


def test_tp_fsdp_two_dimensional_blocks_are_read_row_by_row() -> None:
    """fc2 is split on dim 1 by tensor parallelism and on dim 0 by FSDP: one run per row of each block."""
    ckpt = scan(str(FIXTURES / "tp_fsdp"))
    fc2 = ckpt.tensor("layers.0.fc2.weight")
    assert fc2.shape == (24, 96)
    assert len(fc2.segments) == 24 * 2 and {s.numel for s in fc2.segments} == {48}


def test_uneven_shards_follow_torch_chunk() -> None:
    ckpt = scan(str(FIXTURES / "uneven3"))
    assert [s.numel // 24 for s in ckpt.tensor("layers.0.fc1.weight").segments] == [33, 33, 31]


def test_fsdp2_empty_chunk_is_recorded_and_skipped() -> None:
    """`gate` has 2 rows on 3 ranks: FSDP2 records rank 2's chunk with size 0 at offset 2 (an item too)."""
    from inspector.parse.dcp import read_metadata
    from inspector.system.source import Source

    folder = str(FIXTURES / "uneven3" / "ckpt")
    meta = read_metadata(folder, Source(folder))
    assert [meta.chunk(r) for r in meta.rows("model.gate")][-1] == ((2, 0), (0, 24))
    gate = scan(str(FIXTURES / "uneven3")).tensor("gate")
    assert gate.kind is Kind.TRAINABLE and sum(s.numel for s in gate.segments) == 48


def test_accelerate_folder_found_from_its_checkpoint_and_gets_the_model_folder(tmp_path: Path) -> None:
    ckpt = scan(str(FIXTURES / "accelerate_fsdp2"))
    assert ckpt.tag == "pytorch_model_fsdp_0" and ckpt.root.endswith("checkpoint-2")
    assert any(f.role == "optim" for f in ckpt.files)  # the moments come from optimizer_0/
    assert main(["convert", str(FIXTURES / "accelerate_fsdp2"), str(tmp_path / "out")]) == 0
    assert (tmp_path / "out" / "config.json").is_file()


def _copy(case: str, tmp_path: Path) -> Path:
    dst = tmp_path / case
    shutil.copytree(FIXTURES / case, dst)
    return dst


def test_missing_rank_file_is_an_error_finding(tmp_path: Path) -> None:
    root = _copy("fsdp2_fp32", tmp_path)
    (root / "ckpt" / "__1_0.distcp").unlink()
    ckpt = scan(str(root))
    assert any(f.code == "missing-file" and f.severity is Severity.ERROR for f in ckpt.findings)
    assert main(["convert", str(root), str(tmp_path / "out")]) != 0


def test_truncated_rank_file_is_an_error_finding(tmp_path: Path) -> None:
    root = _copy("fsdp2_fp32", tmp_path)
    f = root / "ckpt" / "__0_0.distcp"
    f.write_bytes(f.read_bytes()[:5000])
    ckpt = scan(str(root))
    bad = [x for x in ckpt.findings if x.code == "bad-chunks"]
    assert bad and all("past the file's end" in x.message or "truncated" in x.message for x in bad)


def test_rank_local_metadata_is_refused_by_name(tmp_path: Path) -> None:
    root = _copy("fsdp2_fp32", tmp_path)
    (root / "ckpt" / ".metadata").rename(root / "ckpt" / "__0.metadata")
    with pytest.raises(UnsupportedCheckpointError, match="rank-local metadata"):
        scan(str(root / "ckpt"))


def test_huggingface_storage_writer_folder_is_refused_by_name(tmp_path: Path) -> None:
    folder = tmp_path / "hf"
    folder.mkdir()
    (folder / ".metadata").write_text(json.dumps({"metadata": {"total_size": 4}, "weight_map": {"a": "x"}}))
    (folder / "model-00001-of-00001.safetensors").write_bytes(b"\x02\x00\x00\x00\x00\x00\x00\x00{}")
    with pytest.raises(UnsupportedCheckpointError, match="HuggingFaceStorageWriter"):
        scan(str(folder))


def test_unknown_metadata_version_is_refused_by_name(tmp_path: Path) -> None:
    root = _copy("fsdp2_fp32", tmp_path)
    meta = root / "ckpt" / ".metadata"
    raw = meta.read_bytes()
    assert raw.count(b"\x8c\x051.0.0") == 1
    meta.write_bytes(raw.replace(b"\x8c\x051.0.0", b"\x8c\x059.9.9"))
    with pytest.raises(UnsupportedCheckpointError, match=r"metadata version 9\.9\.9"):
        scan(str(root))


def test_unknown_transforms_are_refused_by_name() -> None:
    with pytest.raises(UnsupportedCheckpointError, match=r"stream\.lz4/1"):
        refuse_transforms("f", (("stream.lz4/1",),))
    with pytest.raises(UnsupportedCheckpointError, match=r"stream\.lz4/1"):  # zstd chained with another
        refuse_transforms("f", ((), ("stream.zstd/1", "stream.lz4/1")))
    refuse_transforms("f", ((),))
    refuse_transforms("f", ((), ("stream.zstd/1",)))  # read (tests/scan/test_dcp_zstd.py)


def _parse(data: bytes) -> object:
    return MetadataParser(lambda n, o: data[o : o + n], len(data), "m").parse()


def test_metadata_pickle_never_calls_a_global_off_the_allowlist() -> None:
    import os

    with pytest.raises(UnsafePickleError, match="not one of the classes"):
        _parse(pickle.dumps(os.system, protocol=4))


def test_metadata_pickle_refuses_back_references_to_per_item_objects() -> None:
    shared = (1, 2)
    with pytest.raises(UnsafePickleError, match="refers back"):
        _parse(pickle.dumps([shared, shared], protocol=4))


def test_metadata_pickle_cannot_grow_the_stack_out_of_proportion() -> None:
    with pytest.raises(CorruptFileError, match="deeper pickle stack"):
        _parse(b"\x80\x04" + b"N" * 3_000_000 + b".")


@pytest.mark.parametrize("data", [b"", b"\x80\x04", b"\x80\x04}\x94.", b"\x80\x04\xff", b"garbage"])
def test_damaged_metadata_is_a_clear_error(data: bytes) -> None:
    with pytest.raises(CorruptFileError):
        _parse(data)


def _chunk(off: tuple[int, ...], size: tuple[int, ...], at: int) -> Chunk:
    return Chunk(off, size, "f", at)


def test_chunks_that_leave_a_gap_overlap_or_run_past_the_edge_are_refused() -> None:
    assert [
        s.numel for s in runs((4, 2), "float32", [_chunk((0, 0), (2, 2), 0), _chunk((2, 0), (2, 2), 100)])
    ] == [4, 4]
    with pytest.raises(TilingError, match="a gap"):
        runs((4, 2), "float32", [_chunk((0, 0), (1, 2), 0), _chunk((2, 0), (2, 2), 100)])
    with pytest.raises(TilingError, match="overlap"):
        runs((4, 2), "float32", [_chunk((0, 0), (3, 2), 0), _chunk((2, 0), (2, 2), 100)])
    with pytest.raises(TilingError, match="past its edge"):
        runs((4, 2), "float32", [_chunk((0, 0), (2, 2), 0), _chunk((2, 0), (3, 2), 100)])
    with pytest.raises(TilingError, match="cover 2 of the 4"):
        runs((4, 2), "float32", [_chunk((0, 0), (2, 2), 0)])


def test_empty_chunks_are_skipped_and_adjacent_runs_merge() -> None:
    chunks = [_chunk((0, 0), (2, 2), 0), _chunk((2, 0), (2, 2), 16), _chunk((4, 0), (0, 2), 999)]
    assert [(s.offset, s.numel) for s in runs((4, 2), "float32", chunks)] == [(0, 8)]


def test_cli_refusal_has_no_traceback(tmp_path: Path) -> None:
    from tests.conftest import run_cli

    root = _copy("fsdp2_fp32", tmp_path)
    (root / "ckpt" / ".metadata").write_bytes(b"\x80\x04\x95garbage")
    res = run_cli("scan", str(root))
    assert res.rc != 0 and "Traceback" not in res.stderr + res.stdout
    assert "metadata pickle cannot be read" in res.stderr + res.stdout


def test_universal_output_is_refused_for_a_dcp_folder(tmp_path: Path) -> None:
    res = __import__("tests.conftest", fromlist=["run_cli"]).run_cli(
        "convert", str(FIXTURES / "fsdp2_fp32"), str(tmp_path / "out"), "--format", "universal"
    )
    assert res.rc != 0 and "PyTorch Distributed Checkpoint, not a DeepSpeed run" in res.stdout + res.stderr


def test_a_relative_path_is_found(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(FIXTURES)
    assert scan("hsdp").tag == "ckpt"


def test_verify_and_health_read_a_dcp_folder(tmp_path: Path) -> None:
    out = tmp_path / "out"
    assert (
        main(["convert", str(FIXTURES / "tp_fsdp"), str(out), "--dtype", "bfloat16", "--shard-size", "20KB"])
        == 0
    )
    assert len(list(out.glob("*.safetensors"))) > 1
    assert main(["verify", str(FIXTURES / "tp_fsdp"), str(out)]) == 0
    assert main(["health", str(FIXTURES / "tp_fsdp")]) == 0


@pytest.mark.parametrize("case", ["fsdp2_fp32", "titan_final", "accelerate_fsdp2", "lightning"])
def test_summary_names_the_saver_and_world_size_not_zero(case: str) -> None:
    from inspector.scan.summary import summary_rows

    ckpt = scan(str(FIXTURES / case))
    rows = {r.label: r.value for r in summary_rows(ckpt)}
    assert "DeepSpeed" not in rows and "ZeRO" not in rows and "Module copy" not in rows
    saver = {"fsdp2": "torch.distributed.checkpoint", "titan": "torchtitan", "accelerate": "Accelerate"}
    assert rows["Saved by"].startswith("PyTorch DCP (" + saver.get(case.split("_")[0], "Lightning"))
    assert "2 ranks" in rows["Saved by"]
