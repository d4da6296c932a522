"""The scan's overview of every model-parallel layout fixture (real DeepSpeed 0.19.8 runs) against how each
was made (`torchrun --nproc_per_node N` in its versions.txt): the world is N ranks, the degrees multiply to
it, every rank is listed as holding something, stages and tensor-parallel shards on disjoint ranks, each MoE
layer's experts on every rank, and `scan` prints the layout with every row, exit 0."""

from __future__ import annotations

import re

import pytest

from inspector.cli.main import main
from tests.scan.layout_cases import FIXTURES, MODEL_PARALLEL, ckpt_dir, scan_layout, split_args

RANKS = re.compile(r"ranks? ([\d, ]+)")


def _made_with(layout: str) -> int:
    found = re.search(r"--nproc_per_node (\d+)", (FIXTURES / layout / "versions.txt").read_text())
    assert found, layout
    return int(found.group(1))


def _ranks(text: str) -> list[set[int]]:
    return [{int(x) for x in m.group(1).replace(",", " ").split()} for m in RANKS.finditer(text)]


@pytest.mark.parametrize("layout", MODEL_PARALLEL)
def test_the_overview_accounts_for_every_rank(layout: str, capsys: pytest.CaptureFixture[str]) -> None:
    ckpt = scan_layout(layout)
    world, p = _made_with(layout), ckpt.parallel
    assert p is not None and ckpt.world_size == world and not ckpt.errors
    if p.kind == "expert":
        assert p.dp == world and world % p.ep == 0 and p.ep > 1
        for _, held in p.holders:  # one MoE layer: each rank holds exactly one span of its experts
            spans = _ranks(held)
            assert sorted(r for s in spans for r in s) == list(range(world)), held
    else:
        assert p.pp * p.tp * p.dp == world
        # pipeline + native MoE adds a row per MoE layer (its experts over its stage's ranks): counted apart
        rows = [r for _, held in p.holders if not held.startswith("experts") for r in _ranks(held)]
        moe = {r for _, held in p.holders if held.startswith("experts") for s in _ranks(held) for r in s}
        assert moe == (set(range(world)) if p.ep > 1 else set()), p.holders
        assert len(rows) == p.pp * p.tp and sorted(r for s in rows for r in s) == list(range(world)), (
            p.holders
        )
    assert main(["scan", str(ckpt_dir(layout)), *split_args(layout)]) == 0
    shown = " ".join(capsys.readouterr().out.split())
    assert " ".join(p.words.split()) in shown or p.words.split(":")[0] in shown
    for part, _ in p.holders:
        assert part in shown, part
