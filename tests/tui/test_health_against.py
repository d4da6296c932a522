"""Compare any two on the Health tab (#42 item 2): `a` lists the root's other tags and the root bar's other
roots; a Trainer run's checkpoint-N is compared with N-1 by default, and an oldest tag never with a newer one."""

from __future__ import annotations

from pathlib import Path

import pytest
from textual.widgets import Select

from inspector.demo.writer import DemoSpec, write_demo
from inspector.tui.against import NO_COMPARISON, against_choices, default_against
from inspector.tui.app import make_app
from inspector.tui.screens.health import HealthPane
from tests.tui.conftest import plain, scanned, wait_for


@pytest.fixture(scope="module")
def trainer_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    run = tmp_path_factory.mktemp("health-against") / "run"
    for step in (1, 2):
        write_demo(
            str(run / f"checkpoint-{step}"), DemoSpec(params=20_000, tag=f"global_step{step}", steps=step)
        )
    return run


def test_defaults_never_look_forward(trainer_run: Path, two_tag_demo: Path) -> None:
    from inspector.scan.scanner import scan

    roots = (str(trainer_run / "checkpoint-1"), str(trainer_run / "checkpoint-2"))
    newest, oldest = scan(roots[1]), scan(roots[0])
    assert default_against(newest, roots) == roots[0]
    assert default_against(oldest, roots) == NO_COMPARISON  # not checkpoint-2 against checkpoint-1's past
    assert [v for _, v in against_choices(newest, roots)] == [NO_COMPARISON, roots[0]]
    old_tag = scan(str(two_tag_demo), "global_step3")
    assert default_against(old_tag, (str(two_tag_demo),)) == NO_COMPARISON
    assert default_against(scan(str(two_tag_demo)), (str(two_tag_demo),)) == "global_step3"


@pytest.mark.asyncio
async def test_trainer_run_compares_checkpoint_n_with_n_minus_1(trainer_run: Path) -> None:
    app = make_app(path=str(trainer_run), live_meters=False)
    async with app.run_test(size=(120, 36)) as pilot:
        await scanned(pilot)
        assert app.ckpt is not None and app.ckpt.tag == "global_step2"
        await pilot.press("h")
        pane = app.query_one(HealthPane)
        await wait_for(pilot, lambda: pane.report is not None, "the health pass")
        assert pane.report is not None and pane.report.against == "checkpoint-1/global_step1"
        assert any(r.delta_norm is not None for r in pane.report.rows if r.source == "master")
        select = pane.query_one("#health-against", Select)
        labels = [str(label) for label, _ in select._options]  # what the open menu lists
        assert labels == ["nothing (this tag alone)", "root checkpoint-1"]
        assert "checkpoint-1/global_step1" in plain(pane.query_one("#health-status"))
        await pilot.press("a")
        assert select.expanded
        select.value = NO_COMPARISON
        await wait_for(pilot, lambda: pane.report is not None and pane.report.against is None, "tag alone")
