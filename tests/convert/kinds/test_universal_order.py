"""A universal export streams its model-states copies before its tensor files: a ZeRO-1/2 copy is one big
file (the 16-bit model, 381 MiB of the 200M demo's 2.7 GB) that, listed last, ran alone on one worker at the
end. First, it runs beside the tensor files; those keep their order (runs of stage-3 files share stripes)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from inspector.convert import executor
from inspector.convert.kinds.universal.plan import plan_universal
from inspector.demo.writer import DemoSpec
from inspector.scan.scanner import scan
from tests.convert.jobs import universal as write_universal
from tests.convert.jobs import universal_job


@pytest.mark.parametrize("workers", [1, 2])
def test_the_model_states_copy_starts_first(
    demo: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, workers: int
) -> None:
    plan = plan_universal(scan(str(demo(DemoSpec(stage=2, world_size=2, params=400_000)))), str(tmp_path / "o"))
    streamed = universal_job(plan, workers).streamed
    assert [f.name.rsplit("/", 1)[1] for f in streamed[: len(plan.copies)]] == [n for _, n, _ in plan.copies]
    assert streamed[0].nbytes == max(f.nbytes for f in streamed)  # the 16-bit model: the biggest file
    tensors = [f.name.rsplit("/", 1)[1] for f in streamed[len(plan.copies) :]]
    assert tensors == [f.rel.rsplit("/", 1)[1] for f in plan.files]  # in the plan's order
    started: list[int] = []
    real = executor._write_one

    def recording(*a: Any) -> None:
        started.append(a[6])  # the file's index among the streamed files
        real(*a)

    monkeypatch.setattr(executor, "_write_one", recording)
    write_universal(plan, workers=workers)
    assert sorted(started) == list(range(len(streamed)))  # each once
    assert started[0] == 0 or 0 in started[:workers]


def test_every_file_lands_where_the_plan_says(demo: Any, tmp_path: Path) -> None:
    """The copy's and the tensors' writers are the ones their names ask for (indices not crossed)."""
    root = demo(DemoSpec(stage=2, world_size=2, params=400_000))
    plan = plan_universal(scan(str(root)), str(tmp_path / "o"))
    write_universal(plan, workers=2)
    for src, name, size in plan.copies:
        out = Path(plan.out_dir) / name
        assert out.read_bytes() == Path(src).read_bytes() and out.stat().st_size == size
    for f in plan.files:
        assert (Path(plan.out_dir) / f.rel).stat().st_size > 0
