"""The export form and the Tensors tab count the same selection; where the output holds fewer tensors (a tied
weight stored once, as transformers saves it) the form says why in words, never as a user's --exclude."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from inspector.tui.app import make_app
from inspector.tui.widgets.preflight import PreflightPanel
from tests.convert.kinds.hf import trainer_run
from tests.tui.conftest import plain, scanned, wait_for


@pytest.mark.asyncio
async def test_a_tied_weight_is_explained_not_excluded(demo: Any, tmp_path: Path) -> None:
    run = trainer_run(demo, tmp_path)
    app = make_app(path=str(run), out_dir=str(tmp_path / "out"), live_meters=False)
    async with app.run_test(size=(120, 36)) as pilot:
        await scanned(pilot)
        await pilot.press("e")
        await wait_for(pilot, lambda: app.screen.query_one(PreflightPanel).assessment is not None, "preflight")
        summary = plain(app.screen.query_one("#selection-summary"))
        assert "(everything)" in summary and "--exclude" not in summary, summary
        assert "Tied weights stored once" in summary and "lm_head.weight" in summary, summary


@pytest.mark.asyncio
async def test_the_tensors_tab_follows_the_export_dtype(small_demo: Path, tmp_path: Path) -> None:
    """The Tensors tab watches the app's export options (no screen tells it): choosing fp32 on the form
    changes the output dtype the tree and the detail show."""
    from textual.widgets import Select

    app = make_app(path=str(small_demo), out_dir=str(tmp_path / "out"), live_meters=False)
    async with app.run_test(size=(120, 36)) as pilot:
        await scanned(pilot)
        tree = app.main.tensors_pane.module_tree
        assert tree.out_dtype == "bfloat16"
        await pilot.press("e")
        app.screen.query_one("#dtype", Select).value = "fp32"
        await wait_for(pilot, lambda: tree.out_dtype == "float32", "the tree's output dtype")
        assert app.main.tensors_pane.detail.out_dtype == "float32"
