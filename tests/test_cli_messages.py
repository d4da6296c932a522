"""The CLI's words where #28 found them untrue or unhelpful: what --force leaves out, tags, --json failures,
scan --json's hyperparameters, usage of a mistyped flag."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from inspector.demo.writer import DemoSpec
from tests.conftest import CliResult


def truncated_copy(src: Path, dest: Path) -> Path:
    """A copy of the demo `src` whose rank-1 optimizer file is cut in half."""
    shutil.copytree(src, dest)
    tag = (dest / "latest").read_text().strip()
    rank1 = next((dest / tag).glob("*zero_pp_rank_1_*optim_states.pt"))
    data = rank1.read_bytes()
    rank1.write_bytes(data[: len(data) // 2])
    return dest


@pytest.fixture(scope="module")
def small(demo) -> Path:  # type: ignore[no-untyped-def]
    return demo(DemoSpec(params=1_000_000))


def test_force_says_which_tensors_it_leaves_out(
    small: Path, tmp_path: Path, cli: Callable[..., CliResult]
) -> None:
    root = truncated_copy(small, tmp_path / "cut")
    r = cli("convert", root, tmp_path / "out", "--force")
    assert r.rc == 0, r.stderr
    assert "cannot be rebuilt" in r.stdout and "model.embed_tokens.weight" in r.stdout
    assert "leaves them out" in r.stdout


def test_scan_json_hyperparams_are_objects(small: Path, cli: Callable[..., CliResult]) -> None:
    """#28 item 3: a param group's hyperparameters are a JSON object, not "mappingproxy({...})"."""
    r = cli("scan", small, "--json")
    assert r.rc == 0, r.stderr
    groups = json.loads(r.stdout)["groups"]
    assert groups and all(isinstance(g["hyperparams"], dict) for g in groups)
    assert groups[0]["hyperparams"]["lr"] > 0


def test_scan_and_preflight_agree_on_reads_of_a_tied_trainer_run(
    demo, tmp_path: Path, cli: Callable[..., CliResult]  # type: ignore[no-untyped-def]
) -> None:
    """#28 item 14: a Trainer checkpoint with a tied lm_head: scan's read figures are the preflight's (the
    HF model folder it defaults to reads the tied weight once)."""
    from tests.convert.kinds.hf import trainer_run

    run = trainer_run(demo, tmp_path)
    scanned = json.loads(cli("scan", run, "--json").stdout)
    pre = cli("preflight", run, "--json")
    assert pre.rc == 0, pre.stderr
    assert any(t.get("alias_of") for t in scanned["tensors"])
    assert scanned["read_bytes_by_source"] == json.loads(pre.stdout)["read_bytes_by_source"]
