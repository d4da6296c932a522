"""The app opens a PyTorch Distributed Checkpoint (a real FSDP2 folder) and offers its export: no crash, the
preflight answers."""

from __future__ import annotations

from pathlib import Path

import pytest

from inspector.tui.app import make_app
from inspector.tui.widgets.preflight import PreflightPanel
from tests.tui.conftest import scanned, wait_for

FOLDER = Path(__file__).resolve().parents[1] / "fixtures" / "dcp" / "tp_fsdp"


@pytest.mark.asyncio
async def test_a_dcp_folder_scans_and_exports_in_the_app(tmp_path: Path) -> None:
    app = make_app(path=str(FOLDER), out_dir=str(tmp_path / "out"), live_meters=False)
    async with app.run_test(size=(120, 36)) as pilot:
        await scanned(pilot)
        await pilot.press("e")
        await wait_for(pilot, lambda: app.screen.query_one(PreflightPanel).assessment is not None, "preflight")
