"""`convert --part I/N` on every model-parallel layout fixture (real DeepSpeed 0.19.8 runs: expert, pipeline,
tensor parallel and their mixes): N parts then the finishing run give the folder one process writes, byte
for byte, in fp32 and in the training dtype, and as a universal checkpoint where the layout offers one."""

from __future__ import annotations

import filecmp
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest

from inspector.convert.executor import Report
from inspector.convert.kinds import Request, get
from inspector.convert.options import ConvertOptions
from inspector.convert.plan import build_plan
from inspector.errors import InspectorError
from tests.convert.jobs import execute, run
from tests.scan.layout_cases import LAYOUTS, NO_UNIVERSAL, NO_UNIVERSAL_WHY, scan_layout

SHARD = 2_000  # small enough that every fixture writes several shards, so each part owns some


def _tree(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file())


def _same(a: Path, b: Path) -> None:
    names = _tree(a)
    assert names == _tree(b)
    differ = [n for n in names if not filecmp.cmp(a / n, b / n, shallow=False)]
    assert not differ, differ


def _last(events: Iterable[Any]) -> Report:
    return [ev for ev in events if isinstance(ev, Report)][-1]


def test_every_layout_fixture_is_covered() -> None:
    kinds = {name.split("_")[0] for name in LAYOUTS}
    assert {"moe", "autoep", "pp", "pptp", "tp"} <= kinds and len(LAYOUTS) >= 20


@pytest.mark.parametrize("dtype", ["fp32", "auto"])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_weights_parts_then_finish_equal_one_run(layout: str, dtype: str, tmp_path: Path) -> None:
    plan = build_plan(scan_layout(layout), ConvertOptions(dtype=dtype, shard_size=SHARD))
    assert len(plan.shards) >= 3, len(plan.shards)
    execute(plan, str(tmp_path / "one"))
    for n in (2, 3):
        out = tmp_path / f"parts{n}"
        for i in range(n):
            _last(run(plan, str(out), part=(i, n)))
        assert not (out / "model.safetensors.index.json").exists()  # nothing is published by a part
        assert _last(run(plan, str(out))).resumed_shards == len(plan.shards)  # every part's shard reused
        _same(out, tmp_path / "one")


@pytest.mark.parametrize("layout", LAYOUTS)
def test_universal_parts_then_finish_equal_one_run(layout: str, tmp_path: Path) -> None:
    ckpt = scan_layout(layout)
    if layout in NO_UNIVERSAL:  # ZeRO-off pipelines and experts: DeepSpeed cannot resume them
        with pytest.raises(InspectorError, match=NO_UNIVERSAL_WHY):
            get("universal").plan(ckpt, Request(), str(tmp_path / "one"))
        return
    _last(get("universal").plan(ckpt, Request(), str(tmp_path / "one")).run())
    for n in (2, 3):
        out = tmp_path / f"parts{n}"
        job = get("universal").plan(ckpt, Request(), str(out))
        for i in range(n):
            _last(job.run(part=(i, n)))
        _last(job.run())
        _same(out, tmp_path / "one")
