"""The Tensors tab's change-since-the-other-tag line: a damaged other tag is not compared (the health pass's
rule, `health.since.refuse_damaged`); the line says why instead of a figure from a partial tag."""

from __future__ import annotations

import threading
from dataclasses import replace
from pathlib import Path

from rich.text import Text
from textual.message import Message

from inspector.demo.writer import DemoSpec, write_demo
from inspector.scan.scanner import scan
from inspector.tui.screens.tensor_stats import StatsUpdate, stream_stats

SPEC = DemoSpec(stage=2, world_size=2, dtype="bf16", params=20_000)
NAME = "model.layers.0.mlp.up_proj.weight"


def _lines(root: Path) -> list[str]:
    posted: list[Message] = []
    stream_stats(
        scan(str(root), "global_step2"),
        scan(str(root), "global_step2").tensor(NAME),
        threading.Event(),
        posted.append,
        timed=False,
    )
    return [m.result.plain for m in posted if isinstance(m, StatsUpdate) and isinstance(m.result, Text)]


def test_a_damaged_other_tag_is_not_compared(tmp_path: Path) -> None:
    root = tmp_path / "run"
    write_demo(str(root), replace(SPEC, tag="global_step1"))
    write_demo(str(root), replace(SPEC, tag="global_step2"))
    sound = _lines(root)
    assert any("change since global_step1" in line for line in sound) and not any(
        "cannot" in x for x in sound
    )
    cut = root / "global_step1" / "bf16_zero_pp_rank_1_mp_rank_00_optim_states.pt"
    with open(cut, "r+b") as f:
        f.truncate(cut.stat().st_size // 2)
    lines = _lines(root)
    assert any(
        line.startswith("global_step1: cannot compare: The tag to compare with, global_step1, is damaged")
        for line in lines
    ), lines
    assert not any("change since global_step1" in line for line in lines)
