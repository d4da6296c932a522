"""The dirty bytes a run writes before the kernel paces it to the disk (preflight's write-back term)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from inspector.system.writeback import freerun_bytes


def test_the_freerun_point_is_the_kernels(tmp_path: Path) -> None:
    """The midpoint of vm.dirty_background_* and vm.dirty_* (bytes where set, else the ratio of the
    dirtyable memory); infinite where the files cannot be read."""
    vm = tmp_path / "sys" / "vm"
    root = str(tmp_path)
    vm.mkdir(parents=True)
    for name, value in (("dirty_background_ratio", 10), ("dirty_ratio", 20), ("dirty_bytes", 0)):
        (vm / name).write_text(f"{value}\n")
    (vm / "dirty_background_bytes").write_text("0\n")
    assert freerun_bytes(root, dirtyable=100 * 2**30) == pytest.approx(15 * 2**30)
    (vm / "dirty_bytes").write_text(f"{8 * 2**30}\n")  # bytes win over the ratio
    assert freerun_bytes(root, dirtyable=100 * 2**30) == pytest.approx((10 + 8) * 2**30 / 2)
    (vm / "dirty_ratio").unlink()
    (vm / "dirty_bytes").unlink()
    assert freerun_bytes(root, dirtyable=100 * 2**30) == math.inf


def test_this_machine_has_one() -> None:
    assert 0 < freerun_bytes() <= math.inf
