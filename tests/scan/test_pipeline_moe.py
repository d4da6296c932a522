"""Pipeline + native MoE (real DeepSpeed 0.19.8 fixture tests/fixtures/layouts/ppmoe_z1_bf16, made by
tests/fixtures/layouts/make_pipe_moe.py: 2 stages x DP 2, an MoE layer of 4 experts at EP 2 on each stage,
ZeRO-1, bf16): read by the `pipemoe` layout, each stage a native-MoE world, checked against its expected.npz
(the live engines' masters, 16-bit weights and each parameter's stage)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from inspector.cli.main import main
from inspector.errors import DamagedCheckpointError
from inspector.scan.scanner import scan
from tests.scan.layout_cases import assert_exact

ROOT = Path(__file__).resolve().parents[1] / "fixtures" / "layouts" / "ppmoe_z1_bf16"


def test_the_fixture_is_the_layout_it_claims() -> None:
    """Expert files per stage with L restarting at 0 on each, no layer_XX files; the live engines held each
    stage's own MoE layer (global experts 0-3 on both)."""
    names = sorted(p.name for p in (ROOT / "ckpt" / "global_step3").iterdir())
    assert [n for n in names if n.startswith("layer_")] == [
        f"layer_0_expert_{e}_mp_rank_{s:02d}_model_states.pt" for e in range(4) for s in (0, 1)
    ]
    with np.load(ROOT / "expected.npz") as z:
        stages = {k[len("stage/") :]: int(z[k]) for k in z.files if k.startswith("stage/")}
    experts = sorted(n for n in stages if ".deepspeed_experts." in n)
    assert {stages[n] for n in experts if n.startswith("1.")} == {0}
    assert {stages[n] for n in experts if n.startswith("2.")} == {1}
    assert {n.split(".deepspeed_experts.")[1].split(".")[0] for n in experts} == {"0", "1", "2", "3"}


def test_every_stage_reads_exactly(tmp_path: Path) -> None:
    """fp32 output is the live engines' masters bit for bit, the bf16 output their cast; verify passes."""
    ckpt = scan(str(ROOT / "ckpt"))
    assert not ckpt.findings
    assert_exact(ckpt, ROOT, tmp_path)


def test_each_tensor_names_its_stage_as_the_live_engines_held_it() -> None:
    ckpt = scan(str(ROOT / "ckpt"))
    with np.load(ROOT / "expected.npz") as z:
        stages = {k[len("stage/") :]: int(z[k]) for k in z.files if k.startswith("stage/")}
    assert {t.name: t.stage for t in ckpt.tensors} == stages


def test_the_layout_in_words_and_who_holds_what() -> None:
    """2 stages x DP 2, EP 2 on each stage: global rank = stage x 2 + data-parallel rank (pipe-data topology);
    each stage's MoE layer holds experts 0-1 on its first rank and 2-3 on its second."""
    par = scan(str(ROOT / "ckpt")).parallel
    assert par is not None and (par.pp, par.ep, par.dp) == (2, 2, 2)
    assert par.words == "pipeline parallel with native MoE: 2 stages × EP 2 × expert-DP 1 (4 ranks)"
    assert par.holders == (
        ("stage 0", "layers 0-1 · ranks 0, 1"),
        ("1.moe.deepspeed_moe.experts.deepspeed_experts", "experts 0-1: rank 0 · experts 2-3: rank 1"),
        ("stage 1", "layers 2-3 · ranks 2, 3"),
        ("2.moe.deepspeed_moe.experts.deepspeed_experts", "experts 0-1: rank 2 · experts 2-3: rank 3"),
    )


def test_universal_is_refused_naming_why() -> None:
    """DeepSpeed's own ds_to_universal fails on this layout at EP 2 and no universal output of it has been
    shown to resume: the kind is not offered, with the reason, instead of writing an untested folder."""
    from inspector.convert.kinds import get
    from inspector.convert.kinds.base import Why

    offer = get("universal").offer(scan(str(ROOT / "ckpt")))
    assert not offer.available and offer.why is Why.LAYOUT
    assert "pipeline-parallel checkpoint with native MoE" in offer.reason


def _without(tmp_path: Path, name: str) -> Path:
    import shutil

    folder = tmp_path / "ckpt"
    shutil.copytree(ROOT / "ckpt", folder)
    (folder / "global_step3" / name).unlink()
    return folder


@pytest.mark.parametrize(
    ("lost", "code", "words"),
    [
        ("bf16_zero_pp_rank_1_mp_rank_01_optim_states.pt", "missing-rank", "DP rank 1"),
        ("layer_0_expert_3_mp_rank_01_model_states.pt", "missing-expert", "layer_0_expert_3_mp_rank_01"),
    ],
)
def test_a_lost_file_of_a_stage_is_an_error_naming_it(tmp_path: Path, lost: str, code: str, words: str) -> None:
    ckpt = scan(str(_without(tmp_path, lost)))
    assert any(f.code == code and words in f.message for f in ckpt.errors), ckpt.errors


def test_a_lost_stage_is_damage_not_another_layout(tmp_path: Path) -> None:
    """Without stage 1's model states the rank-0 record still says 2 stages: the folder is damaged, and its
    stage-1 files are not called strays of a one-stage MoE run."""
    with pytest.raises(DamagedCheckpointError) as err:
        scan(str(_without(tmp_path, "mp_rank_01_model_states.pt")))
    assert "pipeline stage 1 lacks mp_rank_01_model_states.pt" in err.value.message


def test_the_cli_reads_it(capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["scan", str(ROOT / "ckpt")])
    out = capsys.readouterr()
    assert rc == 0 and "pipeline parallel with native MoE" in out.out and "Traceback" not in out.err + out.out


def test_a_parameter_on_two_stages_is_not_supported_yet(monkeypatch: pytest.MonkeyPatch) -> None:
    """A module tied across stages would be two tensors of one name: refused in words, never written twice
    (the stage-1 scan is made to hold stage 0's `0.weight`, as a tied embedding would)."""
    from dataclasses import replace

    from inspector.errors import UnsupportedCheckpointError
    from inspector.scan.layouts.pipemoe import scanner as pipemoe

    real = pipemoe.scan_moe

    def tied(*args, stage, **kwargs):  # type: ignore[no-untyped-def]
        ckpt = real(*args, stage=stage, **kwargs)
        if stage == 1:
            ckpt = replace(ckpt, tensors=(replace(ckpt.tensors[0], name="0.weight"), *ckpt.tensors[1:]))
        return ckpt

    monkeypatch.setattr(pipemoe, "scan_moe", tied)
    with pytest.raises(UnsupportedCheckpointError) as err:
        scan(str(ROOT / "ckpt"))
    assert "0.weight is held by stage 0 and stage 1" in err.value.message and "not supported yet" in err.value.message
