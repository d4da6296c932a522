"""Pipeline + native MoE (real DeepSpeed 0.19.8 fixture tests/fixtures/layouts_pending/ppmoe_z1_bf16, made by
tests/fixtures/layouts/make_pipe_moe.py: 2 stages x DP 2, an MoE layer of 4 experts at EP 2 on each stage,
ZeRO-1, bf16). The layout is not read yet: it is refused as "not supported yet", naming what was recognised,
never read as tensor-parallel shards and called damaged. Its expected.npz (the live engines' masters) waits
for the reader."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from inspector.cli.main import main
from inspector.errors import UnsupportedCheckpointError
from inspector.scan.scanner import scan

ROOT = Path(__file__).resolve().parents[1] / "fixtures" / "layouts_pending" / "ppmoe_z1_bf16"


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


def test_pipeline_with_native_moe_is_not_supported_yet_not_damaged() -> None:
    with pytest.raises(UnsupportedCheckpointError) as err:
        scan(str(ROOT / "ckpt"))
    message = err.value.message
    assert "pipeline parallel with native MoE" in message and "not supported yet" in message
    assert "the model states say 2 stages" in message and "8 expert files" in message
    assert "4 optimizer files" in message
    assert "damage" not in message and "missing" not in message


def test_the_cli_says_so_and_exits_non_zero(capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["scan", str(ROOT / "ckpt")])
    out = capsys.readouterr()
    assert rc != 0
    assert "not supported yet" in out.err + out.out and "Traceback" not in out.err + out.out
