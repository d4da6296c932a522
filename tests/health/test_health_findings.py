"""Planted damage is found and named, through the core and through `zero-inspector health` as a user runs it."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch

from inspector.demo.writer import DemoSpec, write_demo
from inspector.health import run_check
from inspector.scan.scanner import scan
from tests.conftest import CliResult, DemoCache
from tests.health.helpers import NORM_REL, overwrite, plant, torch_stats, truth

SPEC = DemoSpec(stage=2, world_size=2, dtype="bf16", params=2_000_000)  # four layers: siblings to compare
NAME = "model.layers.2.mlp.down_proj.weight"
TENSOR_KEYS = {"name", "source", "numel", "nan", "inf", "zeros", "min", "max", "mean", "std", "norm"}


def _codes(report: object) -> list[tuple[str, str, str | None, str | None]]:
    return [(str(f.severity), f.code, f.tensor, f.source) for f in report.findings]  # type: ignore[attr-defined]


def test_nan_in_a_master_is_an_error(demo: DemoCache, tmp_path: Path, cli: Callable[..., CliResult]) -> None:
    root = demo.copy(SPEC, tmp_path / "ck")
    plant(scan(str(root)).tensor(NAME).segments, [3, 70_000], [float("nan"), float("-inf")])
    report = run_check(scan(str(root)))
    assert _codes(report)[0] == ("error", "nonfinite-master", NAME, "master")
    assert "1 NaN, 1 −Inf" in report.findings[0].message and "earlier" in report.findings[0].hint
    assert "module-out-of-sync" not in [f.code for f in report.findings]  # the error says it already
    rc, out, err = cli("health", root, "--json")
    assert rc == 1, err
    doc = json.loads(out)
    assert doc["findings"][0]["code"] == "nonfinite-master" and doc["findings"][0]["tensor"] == NAME
    row = next(t for t in doc["tensors"] if t["name"] == NAME and t["source"] == "master")
    assert (row["nan"], row["inf"]) == (1, 1)
    rc, out, err = cli("health", root)
    assert rc == 1 and NAME in out and "Traceback" not in out + err


def test_nan_in_one_moment_only_is_a_warning(
    demo: DemoCache, tmp_path: Path, cli: Callable[..., CliResult]
) -> None:
    root = demo.copy(SPEC, tmp_path / "ck")
    plant(dict(scan(str(root)).tensor(NAME).moments)["exp_avg_sq"], [11], [float("inf")])
    report = run_check(scan(str(root)))
    assert _codes(report) == [("warning", "nonfinite-moment", NAME, "exp_avg_sq")]
    assert "master is finite" in report.findings[0].message
    rc, out, _ = cli("health", root, "--json")
    assert rc == 0
    assert json.loads(out)["findings"][0]["source"] == "exp_avg_sq"


def test_nan_in_the_module_copy_only(demo: DemoCache, tmp_path: Path) -> None:
    root = demo.copy(SPEC, tmp_path / "ck")
    plant(scan(str(root)).tensor(NAME).module_copy, [100], [float("nan")])
    report = run_check(scan(str(root)))
    codes = _codes(report)
    assert codes[0] == ("warning", "nonfinite-module", NAME, "module")
    assert ("warning", "module-out-of-sync", NAME, "module") in codes
    assert not report.errors
    row = next(r for r in report.rows if (r.name, r.source) == (NAME, "module"))
    assert row.module_differing == 1 and row.module_max_diff == math.inf


def test_module_copy_drift_is_measured(demo: DemoCache, tmp_path: Path) -> None:
    root = demo.copy(SPEC, tmp_path / "ck")
    name = "model.layers.1.self_attn.q_proj.weight"
    segs = scan(str(root)).tensor(name).module_copy
    plant(segs, [0, 1], [0.5, -0.25])
    master = truth(SPEC, name, "master")
    row = next(r for r in run_check(scan(str(root))).rows if (r.name, r.source) == (name, "module"))
    want = max(abs(0.5 - float(master[0].astype(np.float32))), abs(-0.25 - float(master[1])))
    assert row.module_differing == 2
    assert row.module_max_diff == pytest.approx(want, rel=1e-2)  # vs the bf16-rounded master


def test_norm_outlier_and_dead_rows(demo: DemoCache, tmp_path: Path) -> None:
    root = demo.copy(SPEC, tmp_path / "ck")
    ckpt = scan(str(root))
    overwrite(ckpt.tensor(NAME).segments, truth(SPEC, NAME, "master") * 40)
    sq = dict(ckpt.tensor("model.layers.0.mlp.gate_proj.weight").moments)["exp_avg_sq"]
    cols = ckpt.tensor("model.layers.0.mlp.gate_proj.weight").shape[1]
    plant(sq, list(range(cols * 2, cols * 5)), [0.0] * (cols * 3))  # rows 2, 3, 4
    report = run_check(scan(str(root)))
    outlier = next(f for f in report.findings if f.code == "norm-outlier")
    assert outlier.tensor == NAME and "40× the median" in outlier.message
    assert "model.layers.N.mlp.down_proj.weight" in outlier.message
    dead = next(f for f in report.findings if f.code == "zero-rows")
    assert dead.tensor == "model.layers.0.mlp.gate_proj.weight" and "3 of" in dead.message


def test_against_another_tag(tmp_path: Path, cli: Callable[..., CliResult]) -> None:
    """Two tags, one master moved: delta_norm equals torch's norm of the difference; others are 0."""
    spec = DemoSpec(stage=3, world_size=2, dtype="bf16", params=300_000)
    root = tmp_path / "run"
    write_demo(str(root), DemoSpec(**{**spec.__dict__, "tag": "global_step1"}))
    write_demo(str(root), DemoSpec(**{**spec.__dict__, "tag": "global_step2"}))
    name = "model.layers.1.self_attn.v_proj.weight"
    old = truth(spec, name, "master")
    new = old + np.linspace(-1e-3, 2e-3, old.size, dtype=np.float32)
    overwrite(scan(str(root), "global_step2").tensor(name).segments, new)
    report = run_check(scan(str(root), "global_step2"), scan(str(root), "global_step1"))
    rows = {r.name: r for r in report.rows if r.source == "master"}
    want = float(torch.linalg.vector_norm(torch.from_numpy(new.astype(np.float64) - old.astype(np.float64))))
    assert rows[name].delta_norm == pytest.approx(want, rel=NORM_REL)
    assert rows[name].delta_rel == pytest.approx(want / torch_stats(new)["norm"], rel=2 * NORM_REL)
    assert all(r.delta_norm == 0 for n, r in rows.items() if n != name)
    moved = [f for f in report.findings if f.code == "moved-most"]
    assert [f.tensor for f in moved] == [name]
    rc, out, err = cli("health", root, "--against", "global_step1", "--json", "--include", "model.layers.1")
    assert rc == 0, err
    doc = json.loads(out)
    assert (doc["tag"], doc["against"]) == ("global_step2", "global_step1")
    assert {t["name"] for t in doc["tensors"]} <= {n for n in rows if n.startswith("model.layers.1.")}
    row = next(t for t in doc["tensors"] if t["name"] == name and t["source"] == "master")
    assert row["delta_norm"] == pytest.approx(want, rel=NORM_REL)
    assert set(row) >= TENSOR_KEYS


def test_json_shape_and_natural_module_order(demo: DemoCache, cli: Callable[..., CliResult]) -> None:
    spec = DemoSpec(stage=1, world_size=2, dtype="bf16", params=300_000)
    rc, out, err = cli("health", demo(spec), "--json", "--exclude", "*.bias")
    assert rc == 0, err
    doc = json.loads(out)
    assert {"tag", "against", "tensors", "modules", "findings"} <= set(doc) and doc["against"] is None
    assert all(set(t) >= TENSOR_KEYS and "delta_norm" not in t for t in doc["tensors"])
    assert not any(t["name"].endswith(".bias") for t in doc["tensors"])
    assert {t["source"] for t in doc["tensors"]} == {
        "master",
        "module",
        "exp_avg",
        "exp_avg_sq",
        "frozen",
        "buffer",
    }
    mods = [m for m in doc["modules"] if m["source"] == "master"]
    layers = [m for m in mods if m["module"].startswith("model.layers.") and m["depth"] == 3]
    assert [m["module"] for m in layers] == [f"model.layers.{i}" for i in range(len(layers))]
    assert len(layers) >= 2
    # a block's norm is the norm of all its masters together
    for m in layers:
        inside = [
            t["norm"]
            for t in doc["tensors"]
            if t["source"] == "master" and t["name"].startswith(m["module"] + ".")
        ]
        assert m["norm"] == pytest.approx(math.sqrt(sum(n * n for n in inside)), rel=1e-12)
        assert m["tensors"] == len(inside)


def test_user_errors_are_messages(demo: DemoCache, cli: Callable[..., CliResult], tmp_path: Path) -> None:
    root = demo(DemoSpec(stage=2, world_size=2, dtype="bf16", params=300_000))
    for args in (["--against", "global_step999"], ["--include", "no.such.tensor"], ["--tag", "nope"]):
        rc, out, err = cli("health", root, *args)
        assert rc != 0 and "Traceback" not in out + err and err.strip(), args
    rc, _, err = cli("health", tmp_path / "missing")
    assert rc == 2 and "Traceback" not in err
