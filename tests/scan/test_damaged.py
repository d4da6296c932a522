"""Damaged checkpoints the scan must report, and paths it must refuse: a missing, extra, duplicate or foreign
rank file is a finding naming the rank; a `latest` or tag outside the root, or a path with no checkpoint, is a
clear refusal with exit 2 and no traceback. (Crafted pickles and damaged files: tests/format/test_hostile.py.)
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from inspector.demo.writer import DemoSpec
from tests.format.test_hostile import (
    MODEL,
    SPEC,
    TAG,
    assert_clean_failure,
    error_findings,
    optim_name,
    scan_json,
)

if TYPE_CHECKING:
    from conftest import CliResult, DemoCache


# --- damaged checkpoints (findings) -----------------------------------------------------------------------------------


def test_missing_rank_file(tmp_path: Path, demo: DemoCache, cli: Callable[..., CliResult]) -> None:
    """A missing middle rank is reported by number, in JSON and in the rich output."""
    root = demo.copy(SPEC, tmp_path / "ckpt")
    (root / TAG / optim_name(1)).unlink()
    doc = scan_json(cli, root)
    missing = error_findings(doc, "missing-rank")
    assert [f["message"] for f in missing] == ["The optimizer file for DP rank 1 is missing."]
    assert doc["world_size"] == 3
    res = cli("scan", root)
    assert_clean_failure(res, "DP rank 1 is missing", rc=1)


def test_last_rank_missing_partition_count_disagrees(
    tmp_path: Path, demo: DemoCache, cli: Callable[..., CliResult]
) -> None:
    """Deleting the last rank leaves 2 files for a 3-way partition: still 3 ranks, rank 2 'missing'."""
    root = demo.copy(SPEC, tmp_path / "ckpt")
    (root / TAG / optim_name(2)).unlink()
    doc = scan_json(cli, root)
    assert doc["world_size"] == 3
    missing = error_findings(doc, "missing-rank")
    assert any("DP rank 2" in f["message"] and "missing" in f["message"] for f in missing)
    trainable = [t for t in doc["tensors"] if t["kind"] == "trainable"]
    assert trainable == []  # never rebuilt from an incomplete set


def test_extra_rank_file_disagrees_with_partition_count(
    tmp_path: Path, demo: DemoCache, cli: Callable[..., CliResult]
) -> None:
    """A fourth rank file in a 3-rank checkpoint (dp_world_size 3) belongs to no rank of the run: a stray-file
    error naming it, and the file is not read (the three real ranks still rebuild)."""
    root = demo.copy(SPEC, tmp_path / "ckpt")
    shutil.copy(root / TAG / optim_name(1), root / TAG / optim_name(3))
    doc = scan_json(cli, root)
    found = error_findings(doc, "stray-file")
    assert any(optim_name(3) in f["message"] and "data-parallel rank is 3" in f["message"] for f in found)
    assert doc["world_size"] == 3
    assert "partition-count" not in {f["code"] for f in doc["findings"]}


def test_duplicate_rank_files(tmp_path: Path, demo: DemoCache, cli: Callable[..., CliResult]) -> None:
    """`bf16_zero_pp_rank_0…` and `zero_pp_rank_0…` side by side: duplicate-rank error naming both."""
    root = demo.copy(SPEC, tmp_path / "ckpt")
    shutil.copy(root / TAG / optim_name(0), root / TAG / optim_name(0, prefix=""))
    doc = scan_json(cli, root)
    dup = error_findings(doc, "duplicate-rank")
    assert any(optim_name(0) in f["message"] and optim_name(0, "") in f["message"] for f in dup)


@pytest.mark.parametrize(
    "other",
    [replace(SPEC, steps=5), replace(SPEC, stage=1)],
    ids=["other-steps", "other-stage"],
)
def test_mixed_runs(tmp_path: Path, demo: DemoCache, cli: Callable[..., CliResult], other: DemoSpec) -> None:
    """One rank's optimizer file from another run (different steps, or stage): mixed-runs error."""
    root = demo.copy(SPEC, tmp_path / "ckpt")
    foreign = demo(other) / (other.tag or f"global_step{other.steps}") / optim_name(1)
    shutil.copy(foreign, root / TAG / optim_name(1))
    doc = scan_json(cli, root)
    mixed = error_findings(doc, "mixed-runs")
    assert any("[1]" in f["message"] and "different runs" in f["message"] for f in mixed)


# --- paths --------------------------------------------------------------------------------------------------------------


def test_latest_names_missing_tag(tmp_path: Path, demo: DemoCache, cli: Callable[..., CliResult]) -> None:
    """`latest` names a tag folder that does not exist: the message lists the tags that do."""
    root = demo.copy(SPEC, tmp_path / "ckpt")
    (root / "latest").write_text("global_step99")
    assert_clean_failure(cli("scan", root), "global_step99", "no such folder", TAG, rc=2)


@pytest.mark.parametrize("how", ["dotdot", "absolute", "symlink", "symlink-via-tag"])
def test_tag_escaping_the_root(
    tmp_path: Path, demo: DemoCache, cli: Callable[..., CliResult], how: str
) -> None:
    """`latest` (or --tag) pointing outside the root is refused even if a checkpoint waits there."""
    root = demo.copy(SPEC, tmp_path / "ckpt")
    outside = tmp_path / "outside"
    shutil.copytree(root / TAG, outside)
    args: tuple[str, ...] = ()
    if how == "dotdot":
        (root / "latest").write_text("../outside")
    elif how == "absolute":
        (root / "latest").write_text(str(outside))
    else:
        (root / "evil").symlink_to(outside, target_is_directory=True)
        if how == "symlink":
            (root / "latest").write_text("evil")
        else:
            args = ("--tag", "evil")
    assert_clean_failure(cli("scan", root, *args), "Unsafe tag", rc=2)


@pytest.mark.parametrize("what", ["empty-dir", "unrelated-files", "a-file", "nonexistent"])
def test_not_a_checkpoint(tmp_path: Path, demo: DemoCache, cli: Callable[..., CliResult], what: str) -> None:
    """Paths that hold no checkpoint: the path is named with what is wrong with it, exit 2."""
    if what == "empty-dir":
        target, needle = tmp_path / "empty", "holds no DeepSpeed checkpoint"
        target.mkdir()
    elif what == "unrelated-files":
        target, needle = tmp_path / "stuff", "holds no DeepSpeed checkpoint"
        (target / "sub").mkdir(parents=True)
        for name in ("README.md", "config.json", "model.safetensors", "sub/notes.txt", "latest.txt"):
            (target / name).write_text("hello")
    elif what == "a-file":
        root = demo.copy(SPEC, tmp_path / "ckpt")
        target, needle = root / TAG / MODEL, "is a file"
    else:
        target, needle = tmp_path / "does" / "not" / "exist", "does not exist"
    assert_clean_failure(cli("scan", target), str(target), needle, rc=2)
