"""Issue 38 against DeepSpeed itself: its `ds_to_universal` on the rewritten AutoTP fixture. With the split
recorded only as an affine map it rebuilds every parameter from the map, and our weights equal its merged
fp32 bit for bit; with a piece held at scale 0.5 it refuses (the moments cannot pass a scaled piece), as the
scan refuses that tensor."""

from __future__ import annotations

import glob
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from inspector.scan.scanner import scan
from tests.interop.conftest import ds_env
from tests.scan.layout_cases import convert, writable
from tests.scan.test_tp_records import EMBED, _map_only, _pattern, _rewrite

pytestmark = pytest.mark.interop


def _ds_to_universal(root: Path, out: Path) -> subprocess.CompletedProcess[str]:
    args = [
        "--input_folder",
        str(root / "global_step3"),
        "--output_folder",
        str(out),
        "--inject_missing_state",
    ]
    args += ["--num_extract_workers", "1", "--num_merge_workers", "1"]
    cmd = [sys.executable, "-m", "deepspeed.checkpoint.ds_to_universal", *args]
    return subprocess.run(cmd, env=ds_env(), capture_output=True, text=True, timeout=600, check=False)


def test_a_map_only_split_equals_ds_to_universal(tmp_path: Path) -> None:
    root = writable("tp_z1_bf16", tmp_path / "ck")
    _rewrite(root, _map_only)
    res = _ds_to_universal(root, tmp_path / "uni")
    assert res.returncode == 0, res.stderr[-2000:]
    ours = convert(scan(str(root)), tmp_path / "ours", "fp32")
    theirs = {}
    for path in glob.glob(str(tmp_path / "uni" / "zero" / "*" / "fp32.pt")):
        theirs[os.path.basename(os.path.dirname(path))] = (
            torch.load(path, weights_only=False)["param"].detach().numpy()
        )
    assert theirs and set(theirs) <= set(ours)
    for name, v in theirs.items():
        assert ours[name].shape == v.shape and np.array_equal(
            ours[name].view(np.uint32), v.view(np.uint32)
        ), name


def test_a_scaled_piece_is_refused_by_deepspeed_too(tmp_path: Path) -> None:
    root = writable("tp_z1_bf16", tmp_path / "ck")

    def halve(info: dict[str, object]) -> None:
        ranks = info["affine_map"]["params"][_pattern(EMBED)]["ranks"]  # type: ignore[index]
        for rank in ranks.values():
            rank["pieces"][0]["scale"] = 0.5

    _rewrite(root, halve)
    res = _ds_to_universal(root, tmp_path / "uni")
    assert res.returncode != 0 and "scaled piece" in res.stdout + res.stderr
    assert [f.code for f in scan(str(root)).errors] == ["tp-scaled"]
