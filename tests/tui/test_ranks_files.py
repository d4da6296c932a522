"""The overview's Ranks table accounts for every file the Files line counts (issue 42 polish): an MoE tag's
expert files and a pipeline's layer files are listed in a `+` row, and the gN columns are explained."""

from __future__ import annotations

import io
import os

import pytest
from rich.console import Console

from inspector.scan.scanner import scan
from inspector.tui.widgets.ranks import OTHERS_NAMED, ranks_table
from tests.scan.layout_cases import ckpt_dir


def _text(table: object) -> str:
    console = Console(width=400, file=io.StringIO(), record=True, color_system=None)
    console.print(table)
    return console.export_text()


@pytest.mark.parametrize("name", ["moe_z2_bf16_ws4", "pp_z1_bf16"])
def test_every_file_is_in_the_table_and_the_columns_are_explained(name: str) -> None:
    ckpt = scan(str(ckpt_dir(name)))
    text = _text(ranks_table(ckpt, whole_names=True))
    names = [os.path.basename(f.path) for f in ckpt.files]
    rank_files = {os.path.basename(p) for r in ckpt.ranks for p in (r.optim_file, r.model_file) if p}
    others = [n for n in names if n not in rank_files]
    assert others  # expert or layer model states, which the rank rows do not list
    shown = [n for n in names if n in text]
    assert len(shown) == len(names) or f"… {len(others) - OTHERS_NAMED} more" in text
    plus = next(line for line in text.splitlines() if line.strip().startswith("+"))
    assert f"{len(others)} files" in plus
    assert "gN: optimizer group N, elements stored / padding" in text
    assert "+: the tag's other files" in text


def test_a_plain_checkpoint_has_no_plus_row() -> None:
    ckpt = scan(str(ckpt_dir("tp_z1_bf16")))
    text = _text(ranks_table(ckpt, whole_names=True))
    assert "+: the tag's other files" not in text
    assert not any(line.strip().startswith("+") for line in text.splitlines())
