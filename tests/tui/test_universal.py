"""The export screen offers DeepSpeed universal checkpoints: preflight, convert in the child, verify."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from textual.widgets import Select

from inspector.convert.writers.universal import plan_universal
from inspector.convert.writers.universal_preflight import estimate_universal
from inspector.tui.app import make_app
from inspector.tui.fmt import size
from inspector.tui.jobs import convert_args
from inspector.tui.screens.convert import ConvertScreen
from inspector.tui.screens.export import ExportScreen
from inspector.tui.widgets.preflight import PreflightPanel
from tests.tui.conftest import plain, scanned, wait_for


@pytest.mark.asyncio
async def test_export_universal_convert_and_verify(small_demo: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    app = make_app(path=str(small_demo), out_dir=str(out), live_meters=False)
    async with app.run_test(size=(120, 36)) as pilot:
        await scanned(pilot)
        await pilot.press("e")
        assert isinstance(app.screen, ExportScreen)
        fmt = app.screen.query_one("#format", Select)
        assert "universal" in {v for _, v in fmt._options}
        fmt.value = "universal"
        await pilot.pause()
        panel = app.screen.query_one(PreflightPanel)
        await wait_for(pilot, lambda: "ds_to_univ" in plain(panel), "the universal preflight")
        text = plain(panel)
        assert "Fits" in text and str(out / "global_step3_uni") in text
        assert "Universal: the whole checkpoint" in plain(app.screen.query_one("#selection-summary"))
        # the same estimate `zero-inspector preflight --format universal` prints
        assert app.ckpt is not None
        est = estimate_universal(plan_universal(app.ckpt, str(out)))
        assert size(est.output_bytes) in text and size(est.predicted_peak_rss) in text
        await pilot.press("ctrl+s")
        await wait_for(
            pilot, lambda: isinstance(app.screen, ConvertScreen) and app.screen.phase == "done", "conversion"
        )
        assert sorted(os.listdir(out)) == ["global_step3_uni", "latest_universal"]
        assert (out / "latest_universal").read_text().strip() == "global_step3_uni"
        assert "Done" in plain(app.screen.query_one("#result"))
        await pilot.press("v")
        await wait_for(pilot, lambda: app.screen.phase == "verified", "verified")
        assert "Verified" in plain(app.screen.query_one("#overall-text"))


def test_universal_command_line() -> None:
    from inspector.convert.plan import ConvertOptions

    args = convert_args(
        "/ck", "t", "/out", ConvertOptions(include=("a",)), overwrite=True, force=False, kind="universal"
    )
    assert args == [
        "convert",
        "/ck",
        "/out",
        "--tag",
        "t",
        "--format",
        "universal",
        "--overwrite",
        "--progress",
        "json",
    ]


def test_a_cancelled_universal_conversion_says_it_resumes(tmp_path: Path) -> None:
    from inspector.tui.jobs import explain_exit

    part = tmp_path / "global_step3_uni.partial" / "zero" / "w"
    part.mkdir(parents=True)
    (part / "fp32.pt").write_bytes(b"x" * 3000)
    title, message, hint = explain_exit(130, True, {}, "", 0, str(tmp_path), resumable=True)
    assert title == "Cancelled" and "kept" in message
    assert "1 unfinished *.partial file(s), 2.9 KiB" in hint and "resumes" in hint
    _, message, _ = explain_exit(130, True, {}, "", 0, str(tmp_path))
    assert "removed its partial output" in message  # safetensors: as before
