"""Merged LoRA is no dead end (#42 item 1): the export form has a Base model field for the merge, checked as
typed with the CLI's remedy pointed at that field, and `open --base/--merge-adapter/--adapter/--weights-only`
preset the form as `convert` reads them. The app's merge is byte for byte the CLI's."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import pytest
from textual.widgets import Input, Select

from inspector.tui.app import make_app
from inspector.tui.screens.export import ExportScreen
from inspector.tui.screens.export_fields import form_remedy
from tests.tui.conftest import converted, launched, plain, scanned, wait_for

FIXTURE = Path(__file__).parents[1] / "fixtures" / "trainer_lora"


@pytest.fixture
def lora_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The Trainer LoRA run, opened from a folder without its `base_llama`: the base must be given."""
    shutil.copytree(FIXTURE, tmp_path / "work")
    monkeypatch.chdir(tmp_path)
    return tmp_path / "work"


def _files(folder: Path) -> dict[str, bytes]:
    return {n: (folder / n).read_bytes() for n in sorted(os.listdir(folder)) if not n.startswith(".")}


def test_remedy_points_at_the_field() -> None:
    said = form_remedy("zero-inspector never downloads. Pass a local copy with --base DIR (e.g. from x).")
    assert "in the Base model field (--base DIR)" in said and "with --base" not in said
    assert form_remedy(None) == "" and form_remedy("Use fp32.") == "Use fp32."


@pytest.mark.parametrize(
    ("flags", "kind"),
    [(["--merge-adapter"], "merged"), (["--adapter"], "adapter"), (["--weights-only"], "weights"), ([], "")],
)
def test_open_presets_the_kind(
    lora_run: Path, monkeypatch: pytest.MonkeyPatch, flags: list[str], kind: str
) -> None:
    launch = launched(monkeypatch, str(lora_run / "run"), *flags)
    assert launch.format == kind and launch.base == ""


def test_open_base_presets_the_merge(lora_run: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    launch = launched(monkeypatch, str(lora_run / "run"), "--base", "work/base")
    assert launch.format == "merged" and launch.base == str(lora_run / "base")


@pytest.mark.parametrize(
    ("flags", "said"),
    [
        (["--adapter", "--merge-adapter"], "more than one output kind"),
        (["--adapter", "--base", "."], "--base is only used with --format merged"),
        (["--base", "no-such-dir"], "is not a folder"),
    ],
)
def test_open_refuses_as_convert_does(lora_run: Path, cli: Any, flags: list[str], said: str) -> None:
    res = cli("open", lora_run / "run", *flags)
    assert res.rc != 0 and said in res.output and "Traceback" not in res.output


@pytest.mark.asyncio
async def test_base_field_unblocks_the_merge_and_exports_what_convert_writes(
    lora_run: Path, tmp_path: Path, cli: Any
) -> None:
    by_app = tmp_path / "app"
    app = make_app(path=str(lora_run / "run"), out_dir=str(by_app), live_meters=False)
    async with app.run_test(size=(120, 36)) as pilot:
        await scanned(pilot)
        await pilot.press("e")
        form = app.screen
        assert isinstance(form, ExportScreen)
        base = form.query_one("#base", Input)
        assert not base.display  # the default kind reads no base
        form.query_one("#format", Select).value = "merged"
        errors = form.query_one("#form-errors")
        await wait_for(pilot, lambda: "Base model not usable" in plain(errors), "the base refusal")
        assert base.display and "in the Base model field (--base DIR)" in plain(errors)
        base.value = "work/nowhere"
        await wait_for(
            pilot, lambda: "Base model: work/nowhere is not a folder" in plain(errors), "bad folder"
        )
        base.value = "work/base"
        await wait_for(pilot, lambda: "options valid" in plain(errors), "a valid base")
        await wait_for(
            pilot, lambda: "Base weights from" in plain(form.query_one("#selection-summary")), "plan"
        )
        assert app.export.base == str(lora_run / "base")
        await pilot.press("escape")
        assert await converted(pilot) == "done"
    by_cli = tmp_path / "cli"
    res = cli("convert", lora_run / "run", by_cli, "--merge-adapter", "--base", lora_run / "base")
    assert res.rc == 0, res.output
    assert "model.safetensors" in _files(by_app) and _files(by_app) == _files(by_cli)


@pytest.mark.asyncio
async def test_notes_of_another_kind_do_not_stay(lora_run: Path, tmp_path: Path) -> None:
    """The adapter's plan notes go when the merge is chosen and refused (#42 item 6: no stale note)."""
    app = make_app(path=str(lora_run / "run"), out_dir=str(tmp_path / "out"), live_meters=False)
    async with app.run_test(size=(120, 36)) as pilot:
        await scanned(pilot)
        await pilot.press("e")
        form = app.screen
        summary = form.query_one("#selection-summary")
        form.query_one("#format", Select).value = "adapter"
        await wait_for(pilot, lambda: "LoRA layer(s)" in plain(summary), "the adapter's notes")
        form.query_one("#format", Select).value = "merged"
        errors = form.query_one("#form-errors")
        await wait_for(pilot, lambda: "Base model not usable" in plain(errors), "the base refusal")
        assert "LoRA layer(s)" not in plain(summary)


@pytest.mark.asyncio
async def test_a_lora_trainer_checkpoint_is_called_one(lora_run: Path, tmp_path: Path) -> None:
    """Polish of #42: the model-folder kind says why a LoRA run has no config.json, and the overview does
    not list the open checkpoint among the 'other' Trainer checkpoints."""
    app = make_app(path=str(lora_run / "run"), out_dir=str(tmp_path / "out"), live_meters=False)
    async with app.run_test(size=(120, 36)) as pilot:
        await scanned(pilot)
        assert app.ckpt is not None and app.ckpt.other_runs == ("checkpoint-3",)
        assert "Other Trainer checkpoints" not in plain(app.main.query_one("#tag-list"))
        await pilot.press("e")
        note = plain(app.screen.query_one("#format-note"))
        assert "a LoRA run saves only its adapter" in note and "not a Trainer checkpoint" not in note


def test_generic_folder_names_propose_distinct_outputs() -> None:
    from inspector.tui.session import ExportSettings

    a = ExportSettings.default_out("/runs/a/checkpoint", "global_step3")
    b = ExportSettings.default_out("/runs/b/checkpoint", "global_step3")
    assert a != b and a.endswith("a-checkpoint-global_step3-safetensors")
    assert ExportSettings.default_out("/runs/llama", "s1").endswith(f"{os.sep}llama-s1-safetensors")
