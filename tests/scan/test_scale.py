"""scan, preflight, convert, verify and health grow linearly (or n log n) in the number of tensors: a model
state with thousands of tiny buffers once made preflight quadratic (a shard's largest tensor recomputed per
tensor; a list membership of dataclasses) and scan quadratic (a list membership per module entry).

Counted, never timed: every Python call on every thread is counted while each command runs in this
process, for n and 4n buffers. Linear work makes 4n cost about 4 times n (less, with fixed costs); the
quadratic spots made it 10 to 16 times. (A quadratic loop inside one C call, such as `x in list`, makes no
Python calls: the benchmark row in tests/benchmarks/scale.py times that kind.)"""

from __future__ import annotations

import sys
import threading
from pathlib import Path
from typing import Any

import pytest
import torch

from inspector.cli.main import main
from inspector.demo.spec import DemoSpec
from inspector.demo.writer import write_demo

SMALL = 1000


def with_buffers(root: Path, n: int, params: int = 50_000) -> Path:
    """A small demo whose model states hold `n` extra one-element buffers (each its own storage); the
    benchmark (tests/benchmarks/scale.py) builds its checkpoints with it too."""
    write_demo(str(root), DemoSpec(params=params))
    tag = next(p for p in root.iterdir() if p.is_dir())
    states = tag / "mp_rank_00_model_states.pt"
    sd = torch.load(states, weights_only=False)
    for i in range(n):
        sd["module"][f"model.extra.b{i}"] = torch.tensor([float(i)])
        sd["buffer_names"].append(f"model.extra.b{i}")
    torch.save(sd, states)
    return root


def calls(argv: list[str]) -> int:
    """Python function calls made while `main(argv)` runs, on every thread."""
    count = 0
    lock = threading.Lock()

    def profile(frame: Any, event: str, arg: Any) -> None:
        nonlocal count
        if event == "call":
            with lock:
                count += 1

    threading.setprofile(profile)
    sys.setprofile(profile)
    try:
        rc = main(argv)
    finally:
        sys.setprofile(None)
        threading.setprofile(None)  # type: ignore[arg-type]
    assert rc == 0, argv
    return count


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    base = tmp_path_factory.mktemp("scale")
    return with_buffers(base / "small", SMALL), with_buffers(base / "large", 4 * SMALL)


@pytest.mark.parametrize("command", ["scan", "preflight", "convert", "health"])
def test_work_grows_linearly_with_the_number_of_tensors(
    command: str, checkpoints: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    counts = []
    for i, root in enumerate(checkpoints):
        argv = [command, str(root)]
        if command == "convert":
            argv.append(str(tmp_path / f"out{i}"))
        counts.append(calls(argv))
        if command == "convert":
            counts[-1] += calls(["verify", str(root), str(tmp_path / f"out{i}")])
    capsys.readouterr()
    ratio = counts[1] / counts[0]
    print(
        f"\n{command}: {counts[0]:,} calls for {SMALL} buffers, {counts[1]:,} for {4 * SMALL} ({ratio:.2f}x)"
    )
    assert ratio < 6, f"{command} made {ratio:.1f}x the calls for 4x the tensors"
