"""`scan` on demo checkpoints in the real DeepSpeed layout: every tensor, kind and fact must be right.

The demo writer knows what each tensor holds (`expected()`), so every fp32 master, Adam moment, frozen
16-bit weight, buffer and tied alias is read back through the scanned segments and compared exactly.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from inspector.convert.reader import FilePool, read_tensor
from inspector.demo.writer import DemoSpec, architecture, expected, state_values, write_demo
from inspector.scan.model import Checkpoint, Kind, Severity
from inspector.scan.scanner import scan

if TYPE_CHECKING:
    from conftest import CliResult, DemoCache

HALF = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}

SPECS = [
    DemoSpec(stage=1, world_size=1, dtype="bf16", params=60_000),
    DemoSpec(stage=1, world_size=3, dtype="fp16", params=80_000),
    DemoSpec(stage=1, world_size=2, dtype="fp32", params=50_000, frozen=False, tied=False),
    DemoSpec(stage=1, world_size=4, dtype="bf16", params=90_000, bf16_optimizer=True),
    DemoSpec(stage=1, world_size=7, dtype="bf16", params=70_000, bf16_optimizer=True, frozen=False),
    DemoSpec(stage=2, world_size=2, dtype="bf16", params=100_000),
    DemoSpec(stage=2, world_size=3, dtype="fp16", params=70_000, tied=False),
    DemoSpec(stage=2, world_size=5, dtype="fp32", params=60_000),
    DemoSpec(stage=2, world_size=8, dtype="bf16", params=120_000, frozen=False),
    DemoSpec(stage=3, world_size=1, dtype="bf16", params=50_000),
    DemoSpec(stage=3, world_size=2, dtype="fp16", params=80_000),
    DemoSpec(stage=3, world_size=3, dtype="bf16", params=100_000, sub_group_size=4_000),
    DemoSpec(stage=3, world_size=6, dtype="fp32", params=60_000, sub_group_size=2_500, tied=False),
    DemoSpec(stage=3, world_size=8, dtype="bf16", params=150_000, frozen=False, sub_group_size=6_000),
]


def spec_id(s: DemoSpec) -> str:
    flags = [f for f, on in (("frozen", s.frozen), ("tied", s.tied), ("bf16opt", s.bf16_optimizer)) if on]
    sub = f"-sub{s.sub_group_size}" if s.sub_group_size < 1_000_000_000 else ""
    return f"s{s.stage}-ws{s.world_size}-{s.dtype}{sub}-" + "+".join(flags or ["plain"])


def kinds_of(spec: DemoSpec) -> dict[str, tuple[Kind, str | None]]:
    """What the demo architecture says each name is: (kind, owner for aliases)."""
    params, tied = architecture(spec)
    out: dict[str, tuple[Kind, str | None]] = {}
    for p in params:
        if p.name in tied:
            out[p.name] = (Kind.TIED, tied[p.name])
        else:
            out[p.name] = (Kind(p.kind), None)
    return out


def check_values(ckpt: Checkpoint, spec: DemoSpec) -> None:
    """Every tensor (and every moment of trainable/tied ones) equals what the demo wrote, bit for bit."""
    half = HALF[spec.dtype]
    with FilePool() as pool:
        for t in ckpt.tensors:
            got = read_tensor(ckpt, t.name, pool=pool)
            want = expected(spec, t.name)
            assert got.dtype == want.dtype, (t.name, got.dtype, want.dtype)
            assert got.shape == want.shape, t.name
            assert got.tobytes() == want.tobytes(), t.name
            if t.kind in (Kind.TRAINABLE, Kind.TIED):
                owner = t.alias_of or t.name
                assert {m for m, _ in t.moments} == {"exp_avg", "exp_avg_sq"}, t.name
                for m in ("exp_avg", "exp_avg_sq"):
                    got_m = read_tensor(ckpt, t.name, m, pool=pool)
                    want_m = state_values(owner, 0, t.numel, m, half).reshape(t.shape)
                    assert got_m.tobytes() == want_m.tobytes(), (t.name, m)
            else:
                assert t.moments == (), t.name


@pytest.mark.parametrize("spec", SPECS, ids=spec_id)
def test_scan_agrees_with_demo(demo: DemoCache, spec: DemoSpec) -> None:
    """Values, kinds, aliases and metadata of a scanned demo match what was written; no findings."""
    ckpt = scan(str(demo(spec)))
    assert ckpt.findings == ()

    want_kinds = kinds_of(spec)
    assert {t.name for t in ckpt.tensors} == set(want_kinds)
    for t in ckpt.tensors:
        kind, owner = want_kinds[t.name]
        assert (t.kind, t.alias_of) == (kind, owner), t.name
        if kind is Kind.TRAINABLE:
            assert t.dtype == "float32"
        elif kind is Kind.FROZEN:
            assert t.dtype == HALF[spec.dtype]
    check_values(ckpt, spec)

    assert ckpt.stage == spec.stage
    assert ckpt.world_size == spec.world_size
    assert ckpt.compute_dtype == HALF[spec.dtype]
    assert ckpt.master_dtype == "float32"
    assert ckpt.deepspeed_version == "0.19.8"
    assert ckpt.global_steps == spec.steps == ckpt.optimizer_step
    assert ckpt.global_samples == spec.steps * 4 * spec.world_size
    assert ckpt.tag == f"global_step{spec.steps}" and ckpt.tags == (ckpt.tag,)
    assert ckpt.layout == "deepspeed"
    if spec.bf16_optimizer:
        assert ckpt.optimizer == "BF16_Optimizer"
        assert ckpt.loss_scale is None and ckpt.dynamic_loss_scale is None
    else:
        assert ckpt.optimizer == (
            "DeepSpeedZeroOptimizer_Stage3" if spec.stage == 3 else "DeepSpeedZeroOptimizer"
        )
        assert ckpt.loss_scale == (256.0 if spec.dtype == "fp16" else 1.0)
        assert ckpt.dynamic_loss_scale is (spec.dtype == "fp16")

    prefix = "bf16_" if spec.dtype == "bf16" else ""
    assert [r.rank for r in ckpt.ranks] == list(range(spec.world_size))
    for r in ckpt.ranks:
        assert r.optim_file is not None
        assert os.path.basename(r.optim_file) == f"{prefix}zero_pp_rank_{r.rank}_mp_rank_00_optim_states.pt"
        if spec.stage == 3:
            assert r.model_file is not None
            assert os.path.basename(r.model_file) == f"zero_pp_rank_{r.rank}_mp_rank_00_model_states.pt"
    n_files = spec.world_size * (2 if spec.stage == 3 else 1) + (0 if spec.stage == 3 else 1)
    assert len(ckpt.files) == n_files
    assert ckpt.total_bytes == sum(p.stat().st_size for p in (demo(spec) / ckpt.tag).iterdir())


@pytest.mark.parametrize("spec", [s for s in SPECS if s.stage < 3], ids=spec_id)
def test_stage12_partition_facts(demo: DemoCache, spec: DemoSpec) -> None:
    """Per group: P = ceil(raw / 2W) * 2W / W, rank paddings clamp((r+1)P - raw, 0, P), trimmed masters."""
    ckpt = scan(str(demo(spec)))
    params, tied = architecture(spec)
    trainable = [p for p in params if p.kind == "trainable" and p.name not in tied]
    raws = [sum(p.numel for p in trainable if p.decay), sum(p.numel for p in trainable if not p.decay)]
    w = spec.world_size
    assert len(ckpt.groups) == 2
    for g, raw in zip(ckpt.groups, raws, strict=True):
        part = math.ceil(raw / (2 * w)) * 2 * w // w
        assert (g.numel, g.partition_numel, g.padded_numel) == (raw, part, part * w)
        assert g.hyperparams["weight_decay"] == (0.01 if g.index == 0 else 0.0)
        for r in ckpt.ranks:
            rg = r.groups[g.index]
            assert rg.partition_numel == part
            assert rg.padding == min(part, max(0, (r.rank + 1) * part - raw))
            stored = part if spec.bf16_optimizer else part - rg.padding
            assert rg.stored_numel == stored
        total_stored = sum(r.groups[g.index].stored_numel for r in ckpt.ranks)
        assert total_stored == (part * w if spec.bf16_optimizer else raw)


@pytest.mark.parametrize("spec", [s for s in SPECS if s.stage == 3], ids=spec_id)
def test_stage3_sub_groups(demo: DemoCache, spec: DemoSpec) -> None:
    """Small sub_group_size gives several sub-groups; each holds sum(ceil(numel/ws)) elements per rank."""
    ckpt = scan(str(demo(spec)))
    several = spec.sub_group_size < 1_000_000_000
    assert (len(ckpt.groups) > 2) if several else (len(ckpt.groups) == 2)
    ws = spec.world_size
    trainable = [t for t in ckpt.tensors if t.kind is Kind.TRAINABLE]
    assert {t.group for t in trainable} == {g.index for g in ckpt.groups}
    for g in ckpt.groups:
        members = [t for t in trainable if t.group == g.index]
        assert g.param_count == len(members) and g.numel == sum(t.numel for t in members)
        assert g.partition_numel == sum(math.ceil(t.numel / ws) for t in members)
        for r in ckpt.ranks:
            rg = r.groups[g.index]
            real = sum(
                max(0, min(math.ceil(t.numel / ws), t.numel - r.rank * math.ceil(t.numel / ws)))
                for t in members
            )
            assert (rg.stored_numel, rg.padding) == (g.partition_numel, g.partition_numel - real)
        if several:
            assert g.partition_numel <= spec.sub_group_size + max(math.ceil(t.numel / ws) for t in members)


def test_numeric_rank_order_beyond_ten(demo: DemoCache) -> None:
    """With 12 ranks, rank 10 comes after rank 9 (lexicographic order would put it after rank 1)."""
    spec = DemoSpec(stage=2, world_size=12, dtype="bf16", params=200_000)
    ckpt = scan(str(demo(spec)))
    assert ckpt.findings == ()
    assert [os.path.basename(r.optim_file or "") for r in ckpt.ranks] == [
        f"bf16_zero_pp_rank_{r}_mp_rank_00_optim_states.pt" for r in range(12)
    ]
    embed = ckpt.tensor("model.embed_tokens.weight")
    files = [re.search(r"rank_(\d+)_", s.file).group(1) for s in embed.segments]  # type: ignore[union-attr]
    assert files == sorted(files, key=int)
    check_values(ckpt, spec)


def test_numeric_rank_order_stage3(demo: DemoCache) -> None:
    """Stage 3 with 11 ranks: both model and optimizer files in numeric order; every slice in place."""
    spec = DemoSpec(stage=3, world_size=11, dtype="fp16", params=60_000, sub_group_size=3_000)
    ckpt = scan(str(demo(spec)))
    assert ckpt.findings == ()
    assert [r.rank for r in ckpt.ranks] == list(range(11))
    assert all(f"_rank_{r.rank}_" in (r.model_file or "") for r in ckpt.ranks)
    check_values(ckpt, spec)


# --- path forms ----------------------------------------------------------------------------------------------------

BASE = DemoSpec(stage=2, world_size=2, dtype="bf16", params=50_000)


def same_content(a: Checkpoint, b: Checkpoint) -> None:
    assert [(t.name, t.shape, t.kind, t.segments) for t in a.tensors] == [
        (t.name, t.shape, t.kind, t.segments) for t in b.tensors
    ]


def test_root_tag_folder_and_tag_option(demo: DemoCache) -> None:
    """Root (via `latest`), the tag folder itself and `--tag` all reach the same checkpoint."""
    root = demo(BASE)
    by_root = scan(str(root))
    by_dir = scan(str(root / "global_step3"))
    by_tag = scan(str(root), tag="global_step3")
    assert by_root.tag == by_dir.tag == by_tag.tag == "global_step3"
    assert by_root.layout == "deepspeed" and by_dir.layout == "tag-dir"
    assert Path(by_dir.root) == root and by_dir.tags == ("global_step3",)
    assert by_root.findings == by_dir.findings == by_tag.findings == ()
    same_content(by_root, by_dir)
    same_content(by_root, by_tag)


def test_hf_trainer_run_folder(tmp_path: Path) -> None:
    """`output_dir/checkpoint-5` and `checkpoint-10`: the newest (numerically) is chosen, runs listed."""
    run = tmp_path / "run"
    for steps in (5, 10):
        ck = run / f"checkpoint-{steps}"
        write_demo(str(ck), replace(BASE, steps=steps))
        for name in ("config.json", "trainer_state.json", "rng_state_0.pth", "training_args.bin"):
            (ck / name).write_text("{}")
    (run / "runs").mkdir()  # tensorboard logs, not a checkpoint
    ckpt = scan(str(run))
    assert ckpt.layout == "hf-trainer"
    assert ckpt.tag == "global_step10" and ckpt.global_steps == 10
    assert Path(ckpt.root) == run / "checkpoint-10"
    assert ckpt.other_runs == ("checkpoint-10", "checkpoint-5")
    assert ckpt.tags == ("global_step10",)
    assert [f.code for f in ckpt.findings] == ["hf-run"]
    assert ckpt.findings[0].severity is Severity.INFO
    assert "checkpoint-10" in ckpt.findings[0].message
    check_values(ckpt, replace(BASE, steps=10))
    older = scan(str(run / "checkpoint-5"))
    assert older.tag == "global_step5" and older.global_steps == 5


def test_lightning_ckpt_folder(tmp_path: Path) -> None:
    """Lightning: `epoch=0-step=3.ckpt/` is a folder with `latest` = 'checkpoint' and tag 'checkpoint'."""
    root = tmp_path / "epoch=0-step=3.ckpt"
    spec = replace(BASE, tag="checkpoint")
    write_demo(str(root), spec)
    assert (root / "latest").read_text() == "checkpoint"
    ckpt = scan(str(root))
    assert ckpt.layout == "lightning" and ckpt.tag == "checkpoint"
    assert ckpt.findings == ()
    check_values(ckpt, spec)


def test_two_tags_without_latest(tmp_path: Path) -> None:
    """No `latest`: the tag with the highest step number wins (global_step12 over global_step3)."""
    root = tmp_path / "ckpt"
    write_demo(str(root), replace(BASE, steps=3))
    write_demo(str(root), replace(BASE, steps=12))
    (root / "latest").unlink()
    ckpt = scan(str(root))
    assert ckpt.tag == "global_step12" and ckpt.global_steps == 12
    assert ckpt.tags == ("global_step3", "global_step12")
    assert [(f.severity, f.code) for f in ckpt.findings] == [(Severity.WARNING, "no-latest")]
    assert "global_step12" in ckpt.findings[0].message
    chosen = scan(str(root), tag="global_step3")
    assert chosen.tag == "global_step3" and chosen.global_steps == 3 and chosen.findings == ()


def test_latest_with_whitespace_and_several_tags(tmp_path: Path) -> None:
    """`latest` is stripped (some tools write a newline) and wins over the numerically newest tag."""
    root = tmp_path / "ckpt"
    write_demo(str(root), replace(BASE, steps=12))
    write_demo(str(root), replace(BASE, steps=3))
    (root / "latest").write_text("global_step3\n")
    shutil.copy(root / "demo_spec.json", root / "zero_to_fp32.py")  # any extra root file is ignored
    ckpt = scan(str(root))
    assert ckpt.tag == "global_step3" and ckpt.findings == ()
    assert ckpt.tags == ("global_step3", "global_step12")


# --- CLI -------------------------------------------------------------------------------------------------------------


def test_scan_json_cli(demo: DemoCache, cli: Callable[..., CliResult]) -> None:
    """`scan --json`: stable keys and plain types; agrees with the in-process scan."""
    spec = DemoSpec(stage=3, world_size=3, dtype="bf16", params=60_000, sub_group_size=3_000)
    root = demo(spec)
    res = cli("scan", root, "--json")
    assert res.rc == 0, res.stderr
    doc = json.loads(res.stdout)
    for key in ("stage", "world_size", "tag", "tags", "deepspeed_version", "tensors", "ranks", "findings"):
        assert key in doc, key
    assert type(doc["stage"]) is int and doc["stage"] == 3
    assert type(doc["world_size"]) is int and doc["world_size"] == 3
    assert doc["tag"] == "global_step3" and doc["tags"] == ["global_step3"]
    assert doc["deepspeed_version"] == "0.19.8"
    assert doc["findings"] == []
    assert len(doc["ranks"]) == 3
    ckpt = scan(str(root))
    assert [t["name"] for t in doc["tensors"]] == [t.name for t in ckpt.tensors]
    for t in doc["tensors"]:
        assert {"name", "shape", "dtype", "kind", "numel", "bytes"} <= set(t)
        assert isinstance(t["shape"], list) and t["numel"] == math.prod(t["shape"])
        info = ckpt.tensor(t["name"])
        assert (t["dtype"], t["kind"], t["bytes"]) == (info.dtype, str(info.kind), info.nbytes)
    tied = next(t for t in doc["tensors"] if t["name"] == "lm_head.weight")
    assert tied["kind"] == "tied" and tied["alias_of"] == "model.embed_tokens.weight"


def test_scan_rich_cli(demo: DemoCache, cli: Callable[..., CliResult]) -> None:
    """The human output names the stage, world size, modules and says nothing is wrong."""
    root = demo(BASE)
    res = cli("scan", root)
    assert res.rc == 0, res.stderr
    assert "Traceback" not in res.output
    assert "stage 2" in res.stdout and "2 ranks" in res.stdout
    assert "model.embed_tokens" in res.stdout and "model.layers.*.mlp.up_proj" in res.stdout
    assert "No problems found" in res.stdout
    res = cli("scan", root / "global_step3", "--tensors")
    assert res.rc == 0, res.stderr
    assert "model.layers.1.mlp.up_proj.weight" in res.stdout and "lm_head.weight" in res.stdout
    res = cli("scan", root, "--tag", "global_step3", "--json")
    assert res.rc == 0 and json.loads(res.stdout)["tag"] == "global_step3"


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_module_copy_is_the_16bit_weights(demo: DemoCache, stage: int) -> None:
    """Stage 1/2 keep every trainable group as one padded 16-bit flat buffer plus the frozen params;
    stage 3 keeps only empty placeholders."""
    ckpt = scan(str(demo(DemoSpec(stage=stage, world_size=3, dtype="fp16", params=60_000))))
    if stage == 3:
        assert ckpt.module_copy_bytes == 0
        return
    flat = sum(g.padded_numel for g in ckpt.groups) * 2
    frozen = sum(t.nbytes for t in ckpt.tensors if t.kind is Kind.FROZEN)
    assert ckpt.module_copy_bytes == flat + frozen
