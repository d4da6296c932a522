"""`--format weights`: safetensors only, the default on a checkpoint without a config."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from safetensors.numpy import load_file

from inspector.convert.kinds import offers
from inspector.convert.options import ConvertOptions
from inspector.scan.scanner import scan
from tests.convert.kinds.hf import SPEC, plan_export, trainer_run


def test_weights_only_and_plain_checkpoints_write_just_weights(demo: Any, tmp_path: Path, cli: Any) -> None:
    run = trainer_run(demo, tmp_path)
    rc, stdout, stderr = cli("convert", run, tmp_path / "w", "--weights-only")
    assert rc == 0, stdout + stderr
    assert sorted(p.name for p in (tmp_path / "w").iterdir()) == ["model.safetensors"]
    keys = set(load_file(tmp_path / "w" / "model.safetensors"))
    assert "lm_head.weight" in keys  # plain conversion keeps every name, as before
    ckpt = scan(str(demo(SPEC)))
    kinds = {o.name: o for o in offers(ckpt)}
    assert kinds["weights"].available and not kinds["model"].available
    assert not kinds["adapter"].available
    assert plan_export(ckpt, ConvertOptions()).kind == "weights"  # the default on a plain checkpoint
