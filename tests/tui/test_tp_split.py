"""`--tp-split` in the app: an AutoTP checkpoint saved by real DeepSpeed with its `universal_checkpoint_info`
removed records no split, so the scan refuses to join its shards. `open CKPT --tp-split …` carries the rules
into the app's scan and order; the export form shows the rules in force, reads edited ones exactly as the CLI
does, scans the tag again with them, and the conversion and verification in the child use them too."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from textual.widgets import Input, Select

from inspector.cli.main import build_parser
from inspector.scan.tp_rules import parse_rules, rules_text
from inspector.tui.app import LaunchOptions, make_app
from inspector.tui.command_line import convert_command
from inspector.tui.jobs import app_order
from inspector.tui.screens.convert import ConvertScreen
from inspector.tui.screens.export import ExportScreen
from tests.scan.layout_cases import expected, writable
from tests.tui.conftest import plain, scanned, wait_for

TAG = "global_step3"
SPLIT = (  # AutoTP's split of the tiny Llama, in --tp-split's words (tests/scan/test_tensor.py)
    ("*.o_proj.weight", "1"),
    ("*.down_proj.weight", "1"),
    ("*norm.weight", "replicated"),
    ("model.embed_tokens.weight", "replicated"),
    ("*", "0"),
)


@pytest.fixture
def unrecorded(tmp_path: Path) -> Path:
    """The tp_z1_bf16 fixture without the record of how its parameters were split."""
    import torch

    root = writable("tp_z1_bf16", tmp_path / "ck")
    path = root / TAG / "mp_rank_00_model_states.pt"
    sd = torch.load(path, weights_only=False)
    sd.pop("universal_checkpoint_info")
    torch.save(sd, path)
    return root


def test_the_form_reads_rules_as_the_cli_does() -> None:
    """One parser for both faces: what `--tp-split` takes, the form takes; what it refuses, with its words."""
    parser = build_parser()
    args = parser.parse_args(["scan", "x", *(f"--tp-split={g}={r}" for g, r in SPLIT)])
    assert tuple(args.tp_split) == parse_rules(rules_text(SPLIT)) == SPLIT
    with pytest.raises(ValueError, match="expected PATTERN=0, PATTERN=1 or PATTERN=replicated"):
        parse_rules("*.weight=2")
    with pytest.raises(SystemExit):
        parser.parse_args(["scan", "x", "--tp-split", "*.weight=2"])


def test_open_carries_the_rules_into_the_launch(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[LaunchOptions] = []
    monkeypatch.setattr("inspector.tui.app.run_app", lambda launch: seen.append(launch) or 0)
    monkeypatch.setattr("inspector.cli.launch._refuse_without_terminal", lambda path: None)  # pytest's pipes
    args = build_parser().parse_args(
        ["open", os.getcwd(), *(a for g, r in SPLIT for a in ("--tp-split", f"{g}={r}"))]
    )
    assert args.func(args) == 0
    assert seen[0].tp_split == SPLIT


@pytest.mark.asyncio
async def test_rules_given_at_launch_join_the_shards_and_reach_the_order(
    unrecorded: Path, tmp_path: Path
) -> None:
    app = make_app(LaunchOptions(path=str(unrecorded), tp_split=SPLIT), live_meters=False)
    async with app.run_test(size=(120, 36)) as pilot:
        await scanned(pilot)
        assert app.ckpt is not None and not app.ckpt.errors and app.ckpt.tensors
        assert app_order(app, str(tmp_path / "out"), force=False).tp_split == SPLIT
        assert "'--tp-split=*.o_proj.weight=1'" in convert_command(app)
        await pilot.press("e")
        assert isinstance(app.screen, ExportScreen)
        assert app.screen.query_one("#tp-split", Input).value == rules_text(SPLIT)
        assert "In force" in plain(app.screen.query_one("#tp-note"))


@pytest.mark.asyncio
async def test_rules_typed_in_the_export_form_export_an_unrecorded_split(
    unrecorded: Path, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    app = make_app(path=str(unrecorded), out_dir=str(out), live_meters=False)
    async with app.run_test(size=(120, 36)) as pilot:
        await scanned(pilot)
        assert app.ckpt is not None and [f.code for f in app.ckpt.errors] == ["tp-unrecorded"]
        assert not app.ckpt.tensors
        await pilot.press("e")
        screen = app.screen
        assert isinstance(screen, ExportScreen)
        rules = screen.query_one("#tp-split", Input)
        assert rules.value == "" and "does not record" in plain(screen.query_one("#tp-note"))
        rules.value = "*=2"  # the CLI refuses it: so does the form, in the same words, and nothing is scanned
        await pilot.pause()
        assert "TP splits: expected PATTERN=0, PATTERN=1 or PATTERN=replicated" in plain(
            screen.query_one("#form-errors")
        )
        assert app.tp_split == ()
        rules.value = rules_text(SPLIT[:-1])  # valid, but leaves parameters unmatched: the scan says which
        await wait_for(
            pilot, lambda: app.tp_split == SPLIT[:-1] and app.ckpt is not None, "the partial rescan"
        )
        assert [f.code for f in app.ckpt.errors] == ["tp-unrecorded"]
        assert "match no --tp-split pattern" in plain(screen.query_one("#tp-note"))
        rules.value = rules_text(SPLIT)
        await wait_for(pilot, lambda: app.tp_split == SPLIT and app.ckpt is not None, "the rescan")
        assert not app.ckpt.errors and app.ckpt.tensors
        screen.query_one("#dtype", Select).value = "fp32"
        await wait_for(pilot, lambda: "Fits" in plain(screen.query_one("#preflight")), "the preflight")
        assert "In force" in plain(screen.query_one("#tp-note"))
        await pilot.press("ctrl+s")
        await wait_for(
            pilot,
            lambda: isinstance(app.screen, ConvertScreen) and app.screen.phase in ("done", "failed"),
            "convert",
        )
        convert = app.screen
        assert isinstance(convert, ConvertScreen) and convert.phase == "done"
        await pilot.press("v")
        await wait_for(
            pilot,
            lambda: (
                convert.phase in ("verified", "done")
                and convert.job == "verify"
                and convert.child is not None
                and not convert.child.running
            ),
            "verify",
        )
        assert convert.phase == "verified"
    from safetensors.numpy import load_file

    written: dict[str, Any] = {}
    for name in os.listdir(out):
        if name.endswith(".safetensors"):
            written.update(load_file(str(out / name)))
    masters = {k[5:]: v for k, v in expected("tp_z1_bf16").items() if k.startswith("fp32/")}
    assert masters and set(masters) <= set(written)
    for name, want in masters.items():  # the shards joined as DeepSpeed's own merge joins them, bit for bit
        assert np.array_equal(written[name].view(np.uint32), want.view(np.uint32)), name
