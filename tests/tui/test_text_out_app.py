"""Text out, through the app (headless pilot): a checkpoint whose folder name and config.json hold every class
of terminal control, Rich markup and a store credential is opened, browsed, exported and converted; no raw
control and no secret ever reaches the screen or a notification."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from inspector.demo.writer import DemoSpec
from inspector.tui.app import make_app
from inspector.tui.screens.convert import ConvertScreen
from inspector.tui.screens.export import ExportScreen
from tests.hostile_text import CONTROLS, raw_controls
from tests.tui.conftest import scanned, wait_for

pytestmark = pytest.mark.asyncio
SPEC = DemoSpec(stage=2, world_size=2, dtype="bf16", params=20_000)
SECRET = "hf_app-secret-0123"
HOSTILE = "".join(v for k, v in CONTROLS.items() if k != "lone surrogate") + "[bold]x[@click=app.quit]y"


def clean(screen: str, where: str) -> None:
    assert not raw_controls(screen, newlines=True), (where, sorted(set(map(repr, raw_controls(screen, newlines=True)))))
    assert SECRET not in screen, where


async def test_hostile_names_and_config_never_reach_the_screen_raw(
    demo, tmp_path: Path, monkeypatch: pytest.MonkeyPatch  # type: ignore[no-untyped-def]
) -> None:
    monkeypatch.setenv("HF_TOKEN", SECRET)
    root = tmp_path / f"run{HOSTILE}{SECRET}"
    shutil.copytree(demo(SPEC), root, symlinks=True)
    (root / "config.json").write_text(
        json.dumps({"model_type": "llama", "torch_dtype": "float16" + HOSTILE, "base_model_name_or_path": HOSTILE})
    )
    out = tmp_path / f"out{HOSTILE}"
    app = make_app(path=str(root), out_dir=str(out), live_meters=False)
    async with app.run_test(size=(140, 40)) as pilot:
        await scanned(pilot)
        assert app.ckpt is not None and not app.ckpt.errors
        clean(app.export_screenshot(), "overview")
        await pilot.press("t")
        await pilot.pause()
        clean(app.export_screenshot(), "tensors")
        await pilot.press("h")
        await wait_for(pilot, lambda: app.main.health_pane.report is not None, "the health pass")
        await pilot.pause()
        clean(app.export_screenshot(), "health")
        await pilot.press("e")
        await wait_for(pilot, lambda: isinstance(app.screen, ExportScreen), "the export form")
        await pilot.pause(0.3)
        clean(app.export_screenshot(), "export")
        await pilot.press("ctrl+s")
        await wait_for(
            pilot, lambda: isinstance(app.screen, ConvertScreen) and app.screen.phase == "done", "conversion"
        )
        clean(app.export_screenshot(), "converted")
        app.notify(f"NOTE{HOSTILE} {SECRET} http://u:pw-9876@h/", title=HOSTILE)  # the one notify exit
        await pilot.pause()
        # a toast is not part of a headless screenshot: what Textual holds to show is checked instead
        notes = [f"{n.title} {n.message}" for n in app._notifications]
        assert any("NOTE" in n for n in notes)
        for note in notes:
            clean(note, "a notification")
            assert "pw-9876" not in note


async def test_a_hostile_folder_that_is_no_checkpoint_is_a_clean_dialog(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from inspector.tui.screens.dialogs import MessageDialog

    monkeypatch.setenv("HF_TOKEN", SECRET)
    folder = tmp_path / f"nothing{HOSTILE}{SECRET}"
    folder.mkdir()
    (folder / "latest").write_text("global_step1" + HOSTILE)
    app = make_app(path=str(folder), live_meters=False)
    async with app.run_test(size=(140, 40)) as pilot:
        await wait_for(pilot, lambda: isinstance(app.screen, MessageDialog), "the error dialog")
        await pilot.pause()
        clean(app.export_screenshot(), "dialog")


async def test_hostile_checkpoint_folders_in_the_roots_picker(demo, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """Folders named with controls are never listed (the name rule); names with markup are, as text."""
    parent = tmp_path / "runs"
    for name in (f"ckpt{HOSTILE}", "a[bold]x[@click=app.quit]y", "b[link=http://x]z"):
        shutil.copytree(demo(SPEC), parent / name, symlinks=True)
    app = make_app(path=str(parent), live_meters=False)
    async with app.run_test(size=(140, 40)) as pilot:
        await scanned(pilot)
        assert len(app.roots) == 2
        clean(app.export_screenshot(), "first root")
        await pilot.press("r")
        await pilot.pause(0.3)
        screen = app.export_screenshot()
        clean(screen, "roots picker")
        assert "[bold]x[@click=app.quit]y" in screen.replace("&#160;", " ")
