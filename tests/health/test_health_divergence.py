"""The findings a diverged run needs (tests/interop/test_health_diverged.py shows them on a real one), each
from rows of a demo checkpoint changed the way such a run changes them: exp_avg_sq grown by orders of
magnitude since the other tag, masters that stopped moving while the engine's step count went on (DeepSpeed
skipped every step), NaN in a master and therefore in its module copy."""

from __future__ import annotations

import dataclasses
import math

import pytest

from inspector.demo.writer import DemoSpec
from inspector.health import Row, run_check
from inspector.health.findings import Steps, findings
from inspector.health.since import GREW_RATIO
from inspector.scan.scanner import scan
from tests.conftest import DemoCache

SPEC = DemoSpec(stage=2, world_size=2, dtype="bf16", params=300_000)


@pytest.fixture
def rows(demo: DemoCache) -> list[Row]:
    return list(run_check(scan(str(demo(SPEC)))).rows)


def _with(rows: list[Row], name: str, source: str, **kw: object) -> list[Row]:
    return [dataclasses.replace(r, **kw) if (r.name, r.source) == (name, source) else r for r in rows]  # type: ignore[arg-type]


def _still(rows: list[Row]) -> list[Row]:
    """Every master unchanged since the other tag."""
    return [dataclasses.replace(r, delta_norm=0.0) if r.source == "master" else r for r in rows]


def test_exp_avg_sq_that_grew_is_named(rows: list[Row]) -> None:
    row = next(r for r in rows if r.source == "exp_avg_sq" and r.stats.norm > 0)
    grown = _with(rows, row.name, "exp_avg_sq", against_norm=row.stats.norm / (10 * GREW_RATIO))
    found = [f for f in findings(grown, "global_step2") if f.code == "moment-grew"]
    assert [(f.tensor, f.source, str(f.severity)) for f in found] == [(row.name, "exp_avg_sq", "warning")]
    assert "grew 1e+05× since global_step2" in found[0].message
    # what Adam's own accumulation can do (<= 1000x from the first step) is not a finding
    calm = _with(rows, row.name, "exp_avg_sq", against_norm=row.stats.norm / 1000)
    assert not [f for f in findings(calm, "global_step2") if f.code == "moment-grew"]


def test_masters_that_stopped_because_every_step_was_skipped(rows: list[Row]) -> None:
    still = _still(rows)
    found = findings(still, "global_step6", Steps(9, 6), Steps(6, 6))
    unchanged = [f for f in found if f.code == "unchanged"]
    assert len(unchanged) == 1 and str(unchanged[0].severity) == "warning"
    assert "all 3 steps since were skipped" in unchanged[0].message and "diverged" in unchanged[0].hint
    skipped = [f for f in found if f.code == "skipped-steps"]
    assert len(skipped) == 1 and "3 of the 9 steps were skipped" in skipped[0].message
    # the same weights with the optimizer's count moving (or no counts at all): saved twice, not skipped
    for now, then in ((Steps(9, 9), Steps(6, 6)), (Steps(), Steps())):
        plain = [
            f for f in findings(still, "global_step6", now, then) if f.code in ("unchanged", "skipped-steps")
        ]
        assert [(f.code, str(f.severity)) for f in plain] == [("unchanged", "info")]


def test_a_broken_master_is_said_once_and_does_not_move(rows: list[Row]) -> None:
    name = next(r.name for r in rows if r.source == "module")
    nan = {"nan": 3}
    broken = [
        dataclasses.replace(r, stats=dataclasses.replace(r.stats, **nan), delta_norm=math.nan)  # type: ignore[arg-type]
        if r.name == name and r.source in ("master", "module")
        else dataclasses.replace(r, delta_norm=1.0)
        if r.source == "master"
        else r
        for r in rows
    ]
    found = findings(broken, "global_step1")
    assert [(f.code, f.tensor) for f in found if str(f.severity) == "error"] == [("nonfinite-master", name)]
    assert "none in global_step1" not in found[0].message  # not known to be the first
    first = _with(broken, name, "master", against_nonfinite=0)
    assert "none in global_step1: it broke after that tag" in findings(first, "global_step1")[0].message
    assert not [f for f in found if f.code == "nonfinite-module"]  # not "…; the fp32 master is finite"
    assert name not in [f.tensor for f in found if f.code == "moved-most"]  # a NaN change is no move
    assert [f for f in found if f.code == "moved-most"]
