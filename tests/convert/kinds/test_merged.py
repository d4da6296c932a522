"""`--format merged`: W + scale·B·A streamed, resumable, verified by recomputing."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import pytest
from safetensors.numpy import load_file

from inspector.convert.options import ConvertOptions
from inspector.errors import UnsupportedCheckpointError
from inspector.scan.basemodel import BaseModelError
from inspector.scan.model import Checkpoint
from inspector.scan.scanner import scan
from tests.convert.kinds.hf import SPEC, expected, lora_checkpoint, plan_export, write


@pytest.mark.parametrize(
    ("config", "q_scale", "e_scale"),
    [
        ({}, 2.0, 2.0),
        ({"use_rslora": True}, 4 / math.sqrt(2), 4 / math.sqrt(2)),
        ({"alpha_pattern": {"q_proj": 16}}, 8.0, 2.0),
        ({"fan_in_fan_out": True}, 2.0, 2.0),  # Conv1D (GPT-2) weights are stored (in, out)
    ],
)
@pytest.mark.parametrize("chunk", [1 << 22, 7])  # whole tensors, and row blocks of one row
def test_merge_matches_numpy(
    demo: Any, tmp_path: Path, config: dict, q_scale: float, e_scale: float, chunk: int
) -> None:
    ckpt = lora_checkpoint(demo, tmp_path, **config)
    xp = plan_export(ckpt, ConvertOptions(dtype="fp32", chunk_elems=chunk), merge=True)
    assert xp.kind == "merged" and not any(n.startswith("Base weights from") for n in xp.notes)
    write(xp, tmp_path / "out")
    got = load_file(tmp_path / "out" / "model.safetensors")
    want = expected(ckpt, q_scale, e_scale, fan=bool(config.get("fan_in_fan_out")))
    assert set(got) == set(want)
    for k, v in want.items():
        np.testing.assert_allclose(got[k], v, rtol=1e-6, atol=1e-6, err_msg=k)
    assert not any("lora" in k for k in got)


def test_merge_from_base_folder_in_bf16(demo: Any, tmp_path: Path) -> None:
    ckpt = lora_checkpoint(demo, tmp_path, with_base=False)
    xp = plan_export(ckpt, ConvertOptions(dtype="bf16"), merge=True)
    assert f"Base weights from {tmp_path / 'base'} " in " ".join(xp.notes)
    assert {f.name for f in xp.side_files} == {"config.json", "tokenizer.json"}
    write(xp, tmp_path / "out")
    raw = load_file(tmp_path / "out" / "model.safetensors")
    for k, v in expected(ckpt, 2.0, 2.0).items():
        assert raw[k].dtype == ml_dtypes.bfloat16
        assert np.array_equal(raw[k].view(np.uint16), v.astype(ml_dtypes.bfloat16).view(np.uint16)), k
    assert json.loads((tmp_path / "out" / "config.json").read_text())["dtype"] == "bfloat16"


def test_merge_refusals_are_clear(demo: Any, tmp_path: Path) -> None:
    dora = lora_checkpoint(demo, tmp_path / "a", use_dora=True)
    with pytest.raises(UnsupportedCheckpointError, match="DoRA"):
        plan_export(dora, ConvertOptions(), merge=True)
    missing = lora_checkpoint(demo, tmp_path / "b", with_base=False, base_model_name_or_path="org/not-local")
    with pytest.raises(BaseModelError, match="org/not-local") as err:
        plan_export(missing, ConvertOptions(), merge=True)
    assert "--base" in err.value.hint and "never downloads" in err.value.hint
    xp = plan_export(missing, ConvertOptions(), merge=True, base=str(tmp_path / "b" / "base"))
    assert xp.kind == "merged"
    plain = scan(str(demo(SPEC)))
    with pytest.raises(Exception, match="no LoRA parameters"):
        plan_export(plain, ConvertOptions(), adapter=True)


def test_merged_output_shards_with_an_index(demo: Any, tmp_path: Path) -> None:
    ckpt = lora_checkpoint(demo, tmp_path)
    xp = plan_export(ckpt, ConvertOptions(dtype="fp32", shard_size=300), merge=True)
    write(xp, tmp_path / "out")
    index = json.loads((tmp_path / "out" / "model.safetensors.index.json").read_text())
    files = sorted(set(index["weight_map"].values()))
    assert len(files) > 1 and files == sorted(p.name for p in (tmp_path / "out").glob("model-*.safetensors"))
    got: dict[str, np.ndarray] = {}
    for f in files:
        got |= load_file(tmp_path / "out" / f)
    want = expected(ckpt, 2.0, 2.0)
    assert set(got) == set(want) == set(index["weight_map"])
    for k, v in want.items():
        np.testing.assert_allclose(got[k], v, rtol=1e-6, atol=1e-6, err_msg=k)
    assert not list((tmp_path / "out").glob("*.partial"))


def test_cli_refusals_and_verify_of_a_merge(demo: Any, tmp_path: Path, cli: Any) -> None:
    from inspector.convert.kinds.merged.merge import is_merged_output

    root = demo(SPEC)
    rc, _, stderr = cli("convert", root, tmp_path / "a", "--adapter")
    assert rc == 2 and "no LoRA parameters" in stderr
    rc, _, stderr = cli("convert", root, tmp_path / "b", "--base", str(tmp_path))
    assert rc == 2 and "--base is only used with --format merged" in stderr
    ckpt = lora_checkpoint(demo, tmp_path)
    write(plan_export(ckpt, ConvertOptions(), merge=True), tmp_path / "merged")
    assert is_merged_output(str(tmp_path / "merged"))
    rc, _, stderr = cli("verify", root, tmp_path / "merged")  # not the checkpoint it was merged from
    assert rc == 2 and "holds no LoRA adapter" in stderr

    rc, _, stderr = cli("convert", root, tmp_path / "plain")
    assert rc == 0 and not is_merged_output(str(tmp_path / "plain"))


def test_a_merge_takes_the_output_folder_like_every_writer(demo: Any, tmp_path: Path) -> None:
    """The merged model used to write without the folder lock: a second conversion into the same folder
    would have mixed its shards in. Now it is refused while another run holds the folder, and the folder is
    free again (no lock file left) after the merge."""
    from inspector.convert.root import LOCK, OutputRoot
    from inspector.errors import OutputError

    ckpt = lora_checkpoint(demo, tmp_path)
    xp = plan_export(ckpt, ConvertOptions(), merge=True)
    out = tmp_path / "merged"
    other = OutputRoot(str(out))
    try:
        with pytest.raises(OutputError, match="Another conversion"):
            write(xp, out)
    finally:
        other.release(ok=True)
    write(xp, out)
    assert (out / "model.safetensors").is_file() and not (out / LOCK).exists()


def _verify_merged(ckpt: Checkpoint, out: Path) -> Any:
    from inspector.convert.kinds import of_output
    from inspector.convert.verify import VerifyResult

    kind = of_output(str(out))
    assert kind.name == "merged"
    res = [ev for ev in kind.verify(ckpt, str(out)) if isinstance(ev, VerifyResult)]
    return res[-1]


@pytest.mark.parametrize(
    ("dtype", "config"), [("fp32", {}), ("bf16", {"use_rslora": True}), ("fp16", {"fan_in_fan_out": True})]
)
def test_merged_output_verifies_by_recomputing(demo: Any, tmp_path: Path, dtype: str, config: dict) -> None:
    """verify recomputes W + scale·B·A in float64 from the sources and holds the output to the output dtype's
    rounding: a merge it wrote passes; one merged value moved by a few units in the last place fails, named;
    an unmerged weight changed in its last bit fails too (the fp32 bound is stated in kinds/merged/verify.py) (those are compared byte for byte)."""
    ckpt = lora_checkpoint(demo, tmp_path, **config)
    out = tmp_path / "out"
    write(plan_export(ckpt, ConvertOptions(dtype=dtype), merge=True), out)
    res = _verify_merged(ckpt, out)
    assert res.ok and res.checked == len(load_file(out / "model.safetensors")), res
    assert any("recomputed in float64" in n for n in res.notes)

    def nudge(name: str, ulps: int) -> None:
        from inspector.parse.safetensors import read_header
        from inspector.system.source import Source

        src = Source.at(str(out))
        header = read_header(src, str(out / "model.safetensors"), exact=False)
        e = next(e for e in header.entries if e.name == name)
        raw = bytearray((out / "model.safetensors").read_bytes())
        size = {"fp32": 4, "bf16": 2, "fp16": 2}[dtype]
        at = header.data_start + e.begin
        value = int.from_bytes(raw[at : at + size], "little") + ulps
        raw[at : at + size] = value.to_bytes(size, "little")
        (out / "model.safetensors").write_bytes(bytes(raw))

    merged = "model.layers.0.self_attn.q_proj.weight"
    # fp32: the bound includes the fp32 arithmetic's own error (a few units); 16-bit: one unit is the bound
    ulps = 64 if dtype == "fp32" else 2
    nudge(merged, ulps)
    res = _verify_merged(ckpt, out)
    assert not res.ok and res.mismatched == [merged], res
    nudge(merged, -ulps)
    assert _verify_merged(ckpt, out).ok
    nudge("model.norm.weight", 1)
    assert _verify_merged(ckpt, out).mismatched == ["model.norm.weight"]


@pytest.mark.parametrize("damage", [None, "flip"])
def test_a_killed_merge_resumes_from_its_journal(demo: Any, tmp_path: Path, damage: str | None) -> None:
    """What a SIGKILL after some shards leaves (finished `*.partial` files and the journal listing them with
    their CRC-32): the rerun reuses the intact ones, rewrites a damaged one, and the result equals an
    undisturbed merge byte for byte."""
    import zlib

    from inspector.convert.executor import Report
    from inspector.convert.journal import JOURNAL
    from inspector.convert.root import PARTIAL

    ckpt = lora_checkpoint(demo, tmp_path)
    opts = ConvertOptions(dtype="bf16", shard_size=120)
    clean, out = tmp_path / "clean", tmp_path / "out"
    write(plan_export(ckpt, opts, merge=True), clean)
    job = replace(plan_export(ckpt, opts, merge=True), out_dir=str(out))
    shards = [s.filename for s in job.plan.shards]
    assert len(shards) > 2
    out.mkdir()
    done = shards[:-1]  # the last shard was being written when the kill came
    for name in done:
        (out / (name + PARTIAL)).write_bytes((clean / name).read_bytes())
    (out / (shards[-1] + PARTIAL)).write_bytes((clean / shards[-1]).read_bytes()[:100])
    lines = [json.dumps({"job": job.identity})]
    for n in done:
        raw = (out / (n + PARTIAL)).read_bytes()
        lines.append(json.dumps({"file": n, "size": len(raw), "crc32": zlib.crc32(raw)}))
    (out / JOURNAL).write_text("\n".join(lines) + "\n")
    if damage:
        victim = out / (done[0] + PARTIAL)
        raw = bytearray(victim.read_bytes())
        raw[-2] ^= 0x40
        victim.write_bytes(bytes(raw))
    report = [ev for ev in job.run() if isinstance(ev, Report)][-1]
    assert report.resumed_shards == len(done) - (1 if damage else 0)
    for name in [*shards, "model.safetensors.index.json"]:
        assert (out / name).read_bytes() == (clean / name).read_bytes(), name
    assert not [p for p in out.iterdir() if p.name.endswith(PARTIAL) or p.name.startswith(JOURNAL)]


def test_a_merge_with_another_base_does_not_reuse_shards(demo: Any, tmp_path: Path) -> None:
    """The journal's job fingerprint covers the scales and the base folder's files: a rerun with a different
    base (same checkpoint, same options) starts afresh instead of mixing two merges."""
    ckpt = lora_checkpoint(demo, tmp_path, with_base=False)
    one = plan_export(ckpt, ConvertOptions(), merge=True)
    other_base = tmp_path / "base2"
    other_base.mkdir()
    (other_base / "model.safetensors").write_bytes((tmp_path / "base" / "model.safetensors").read_bytes())
    two = plan_export(ckpt, ConvertOptions(), merge=True, base=str(other_base))
    assert one.plan.fingerprint != two.plan.fingerprint


def test_force_reaches_the_merge(demo: Any, tmp_path: Path) -> None:
    """--force (Request.allow_damaged) plans a merge of a checkpoint with error findings, as every other
    safetensors kind does; without it the merge is refused."""
    from inspector.convert.kinds import Request, get
    from inspector.errors import DamagedCheckpointError
    from inspector.scan.model import Finding, Severity

    ckpt = lora_checkpoint(demo, tmp_path)
    damaged = replace(ckpt, findings=(Finding(Severity.ERROR, "test", "a damaged rank file"),))
    with pytest.raises(DamagedCheckpointError):
        get("merged").plan(damaged, Request(ConvertOptions()), str(tmp_path / "out"))
    job = get("merged").plan(damaged, Request(ConvertOptions(), allow_damaged=True), str(tmp_path / "out"))
    assert job.files
