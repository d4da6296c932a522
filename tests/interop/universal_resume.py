"""What the universal-resume interop tests share: a torchrun command on local CPU ranks, one resume run retried
once in a clean folder, and the check that a reference DeepSpeed wrote today is the committed one."""

from __future__ import annotations

import shutil
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from tests.interop.conftest import _free_port, _heavy_lock, _run_logged
from tests.scan.layout_cases import ckpt_dir


def with_universal(fixture: str, tmp_path: Path, inspector_cli: Any) -> Path:
    """Layout fixture `fixture` copied to tmp_path/ckpt with our universal checkpoint written beside its tag
    (`convert --format universal`): the folder a resume loads."""
    root = tmp_path / "ckpt"
    shutil.copytree(ckpt_dir(fixture), root)
    proc = inspector_cli("convert", str(root), str(root), "--format", "universal")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return root


def torchrun(ranks: int) -> list[str]:
    """torchrun on `ranks` local ranks, on a port that is free now."""
    port = str(_free_port())
    exe = str(Path(sys.executable).with_name("torchrun"))
    return [exe, "--nproc_per_node", str(ranks), "--master_addr", "127.0.0.1", "--master_port", port]


def resumed(
    ranks: int,
    script: Path,
    args: Callable[[Path], list[str]],
    what: str,
    tmp_path: Path,
    interop_cache: Path,
) -> dict[str, Any]:
    """`script args(RESULT.pt)` run once under torchrun, retried once in a clean folder on a fresh port (a gloo
    rank on the CPU can abort at teardown after its work, as test_layouts_interop saw): what it saved."""
    for attempt in (1, 2):
        result = tmp_path / f"resumed-{attempt}.pt"
        cmd = [*torchrun(ranks), str(script), *args(result)]
        try:
            with _heavy_lock(interop_cache):
                _run_logged(cmd, tmp_path / f"resume-{attempt}.log", f"DeepSpeed resume of {what}", 300)
            return dict(torch.load(result, weights_only=False))
        except RuntimeError:
            if attempt == 2:
                raise
    raise AssertionError("unreachable")


def assert_committed(today: Mapping[str, Any], committed_npz: Path) -> None:
    """The reference ds_to_universal wrote today holds the committed arrays, key for key and byte for byte."""
    with np.load(committed_npz) as z:
        committed = {k: z[k] for k in z.files}
    assert sorted(today) == sorted(committed)
    for k, v in committed.items():
        mine = np.asarray(today[k])
        assert mine.dtype == v.dtype and mine.shape == v.shape and mine.tobytes() == v.tobytes(), k
