"""`health --against` between two saves of one DCP run (tests/fixtures/dcp/steps, make_dcp.py --case steps:
FSDP2 on 2 ranks, `dcp.save` after step 1 and step 2 into `checkpoint-1/` and `checkpoint-2/`): each master's
distance moved is the norm of the difference of the live engine's full state dicts at the two steps."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from inspector.cli.main import main
from inspector.scan.scanner import scan

CASE = Path(__file__).resolve().parents[1] / "fixtures" / "dcp" / "steps"


def _state(name: str) -> dict[str, np.ndarray]:
    exp = np.load(CASE / name)
    dtypes = json.loads(bytes(exp["__dtypes__"]).decode())
    return {k: exp[k].view(np.dtype(v)).astype(np.float64) for k, v in dtypes.items() if v == "float32"}


def test_the_latest_step_is_scanned_and_the_other_is_a_tag() -> None:
    ckpt = scan(str(CASE))
    assert (ckpt.tag, ckpt.optimizer_step, ckpt.tags) == ("checkpoint-2", 2, ("checkpoint-2", "checkpoint-1"))
    assert scan(str(CASE), "checkpoint-1").optimizer_step == 1


def test_against_measures_each_masters_move(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["health", str(CASE), "--against", "checkpoint-1", "--json"]) in (0, 1)  # 1: warnings found
    report = json.loads(capsys.readouterr().out)
    assert (report["tag"], report["against"]) == ("checkpoint-2", "checkpoint-1")
    now, then = _state("expected.npz"), _state("expected-step-1.npz")
    masters = {t["name"]: t for t in report["tensors"] if t["source"] == "master"}
    assert sorted(masters) == sorted(now)
    moved = {k: float(np.linalg.norm(now[k] - then[k])) for k in now}
    assert sum(moved.values()) > 0  # the fixture's two steps differ: the check below can fail
    for k, t in masters.items():
        assert t["norm"] == pytest.approx(float(np.linalg.norm(now[k])), rel=1e-6)
        assert t["delta_norm"] == pytest.approx(moved[k], rel=1e-6, abs=1e-12)
