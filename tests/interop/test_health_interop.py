"""`zero-inspector health` on checkpoints written by real DeepSpeed: every statistic equals torch's on DeepSpeed's
own reconstruction (zero_to_fp32 via ds_reference.py for the masters, frozen parameters and buffers; the
module copy as saved; the training engine's `safe_get_full_optimizer_state` for the Adam moments), and
`--against` on a longer run of the same training equals torch's norm of the difference.

Tolerances: the worst-case bounds inspector/health/numerics.py states for its float32 block sums (torch in
float64 here): counts, min, max exact; mean within MEAN_SPAN of max - min; std and norm relative.
"""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from inspector.health.numerics import MEAN_SPAN, NORM_REL, STD_REL
from tests.interop.conftest import HERE, Config, run_inspector

pytestmark = pytest.mark.interop



def _torch_stats(t: torch.Tensor) -> dict[str, float | int]:
    x = t.detach().reshape(-1).to(torch.float64)
    fin = x[torch.isfinite(x)]
    return {
        "numel": x.numel(),
        "nan": int(torch.isnan(x).sum()),
        "inf": int(torch.isinf(x).sum()),
        "zeros": int((x == 0).sum()),
        "min": float(fin.min()),
        "max": float(fin.max()),
        "mean": float(fin.mean()),
        "std": float(fin.std(correction=0)),
        "norm": float(torch.linalg.vector_norm(fin)),
    }


def _check(row: dict[str, Any], ref: torch.Tensor, what: str) -> None:
    want = _torch_stats(ref)
    for k in ("numel", "nan", "inf", "zeros", "min", "max"):
        assert row[k] == want[k], f"{what}: {k} {row[k]} != {want[k]}"
    span = float(want["max"]) - float(want["min"])
    assert abs(row["mean"] - want["mean"]) <= MEAN_SPAN * span + 1e-300, f"{what}: mean"
    assert math.isclose(row["std"], want["std"], rel_tol=STD_REL, abs_tol=1e-300), f"{what}: std"
    assert math.isclose(row["norm"], want["norm"], rel_tol=NORM_REL, abs_tol=1e-300), f"{what}: norm"


def _health(*args: str) -> tuple[int, dict[str, Any]]:
    proc = run_inspector("health", *args, "--json")
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc.returncode, json.loads(proc.stdout)


@pytest.mark.configs("s1_bf16", "s2_bf16", "s3_bf16", "s2_fp16", "s2_fp32", "s3_sub_group")
def test_statistics_equal_torch_on_deepspeeds_reconstruction(
    config: str, ds_checkpoint: Callable, reference: Callable, live_state: Callable
) -> None:
    built, ref, live = ds_checkpoint(config), reference(config), live_state(config)
    rc, doc = _health(str(built.root))
    assert rc == 0, doc["findings"]
    assert doc["tag"] == ref.tag and not [f for f in doc["findings"] if f["severity"] == "error"]
    rows = {(t["name"], t["source"]): t for t in doc["tensors"]}
    checked: dict[str, int] = {}
    for name, kind in ref.kinds.items():
        if kind == "tied":
            assert (name, "master") not in rows or (ref.aliases.get(name), "master") not in rows
            continue
        if name not in ref.tensors or not ref.tensors[name].is_floating_point():
            continue
        source = {"trainable": "master", "frozen": "frozen", "buffer": "buffer"}[kind]
        _check(rows[(name, source)], ref.tensors[name], f"{name}/{source}")
        checked[source] = checked.get(source, 0) + 1
        if kind != "trainable":
            continue
        for moment in ("exp_avg", "exp_avg_sq"):
            if f"{name}/{moment}" in live:
                _check(rows[(name, moment)], live[f"{name}/{moment}"], f"{name}/{moment}")
                checked[moment] = checked.get(moment, 0) + 1
        if ref.stage != 3 and name in ref.module and ref.module[name].numel():
            row = rows[(name, "module")]
            _check(row, ref.module[name], f"{name}/module")
            assert (row["module_max_diff"], row["module_differing"]) == (0.0, 0), name
            checked["module"] = checked.get("module", 0) + 1
    assert checked.get("master", 0) >= 3 and checked.get("exp_avg", 0) >= 3, checked
    if ref.stage != 3:
        assert checked.get("module", 0) >= 3, checked


def _reference_of(root: Path, out: Path) -> dict[str, torch.Tensor]:
    subprocess.run(
        [sys.executable, str(HERE / "ds_reference.py"), str(root), str(out)],
        check=True,
        capture_output=True,
        timeout=600,
    )
    return dict(torch.load(out, map_location="cpu", weights_only=True)["tensors"])


def test_against_an_earlier_tag_of_the_same_run(
    _factory: Any, ds_checkpoint: Callable, reference: Callable, tmp_path: Path
) -> None:
    """The same training (seeded) saved after 3 and after 6 steps, both tags under one root: each master's
    delta_norm equals torch's norm of the difference of DeepSpeed's reconstructions."""
    early = ds_checkpoint("s2_bf16")
    base = early.config
    late = _factory._build(
        Config("s2_bf16_steps6", 2, frozen=base.frozen, tied=base.tied, groups=base.groups, steps=6)
    )
    tag3, tag6 = ((b.root / "latest").read_text().strip() for b in (early, late))
    assert tag3 != tag6
    root = tmp_path / "run"
    root.mkdir()
    shutil.copytree(early.root / tag3, root / tag3)
    shutil.copytree(late.root / tag6, root / tag6)
    (root / "latest").write_text(tag6)
    ref3 = reference("s2_bf16").tensors
    ref6 = _reference_of(late.root, tmp_path / "ref6.pt")
    rc, doc = _health(str(root), "--against", tag3)
    assert rc == 0 and (doc["tag"], doc["against"]) == (tag6, tag3)
    masters = {t["name"]: t for t in doc["tensors"] if t["source"] == "master"}
    assert masters
    moved = 0
    for name, row in masters.items():
        want = float(torch.linalg.vector_norm(ref6[name].double() - ref3[name].double()))
        assert math.isclose(row["delta_norm"], want, rel_tol=NORM_REL, abs_tol=1e-300), name
        moved += want > 0
    assert moved >= len(masters) // 2
    assert any(f["code"] == "moved-most" for f in doc["findings"])
