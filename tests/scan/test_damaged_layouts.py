"""Damage to any one file of every model-parallel layout fixture (real DeepSpeed 0.19.8 runs): each expert
file, pipeline stage and layer file, tensor-parallel shard and optimizer file, removed or cut in half. `convert`
refuses with a clear message (what, and what to do), exits non-zero, never shows a traceback and writes
nothing, inside OUT or beside it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from inspector.cli.main import main
from inspector.scan.scanner import scan
from tests.scan.layout_cases import FIXTURES, writable

TAG = "global_step3"
CASES = sorted(
    (p.parent.parent.parent.name, p.name) for p in FIXTURES.glob(f"*/ckpt/{TAG}/*.pt")
)  # (layout, file): every file of every fixture


def _damage(root: Path, name: str, how: str) -> None:
    path = root / TAG / name
    if how == "rm":
        os.remove(path)
    else:
        os.truncate(path, path.stat().st_size // 2)


def _files(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


def test_the_cases_cover_every_kind_of_file() -> None:
    names = {n for _, n in CASES}
    assert any("_expert_" in n for n in names) and any(
        n.startswith("layer_0") and "-model" in n for n in names
    )
    assert any("optim_states" in n for n in names) and any("mp_rank_01_model" in n for n in names)
    assert len({layout for layout, _ in CASES}) >= 20


@pytest.mark.parametrize("how", ["rm", "cut"])
@pytest.mark.parametrize(("layout", "name"), CASES)
def test_a_damaged_file_is_refused_clearly_and_nothing_is_written(
    layout: str, name: str, how: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = writable(layout, tmp_path / "ckpt")
    _damage(root, name, how)
    before = _files(tmp_path)
    rc = main(["convert", str(root), str(tmp_path / "out")])
    err = capsys.readouterr()
    assert rc != 0, err.out
    assert "Traceback" not in err.out + err.err
    assert "→" in err.err, err.err  # what to do comes with what is wrong
    assert _files(tmp_path) == before  # no OUT, nothing beside it, the checkpoint untouched


def test_a_pipelines_tied_module_file_missing_is_named(tmp_path: Path) -> None:
    """layer_00 holds the tied embedding alone (no `0.` name points to it): its loss is an error, not silence
    (before, the scan found no problem and --source module lost the embedding's 16-bit copy)."""
    root = writable("pp_z1_bf16", tmp_path / "ckpt")
    assert not scan(str(root)).errors
    os.remove(root / TAG / "layer_00-model_states.pt")
    errors = scan(str(root)).errors
    assert [f.code for f in errors] == ["missing-layer"] and "tied_modules.embed" in errors[0].message
