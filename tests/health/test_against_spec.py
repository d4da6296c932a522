"""`health --against TAG|PATH[@TAG]` (#42 item 2): another tag of the root, a sibling Trainer checkpoint by its
name, any path, or PATH@TAG; what names nothing is said in `--against`'s words (never "--tag names…")."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from inspector.demo.writer import DemoSpec, write_demo
from inspector.errors import NotACheckpointError
from inspector.health.against import against_location


@pytest.fixture(scope="module")
def trainer_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """run/checkpoint-1 (global_step1) and run/checkpoint-2 (global_step2), as a Trainer saves them."""
    run = tmp_path_factory.mktemp("against") / "run"
    for step in (1, 2):
        write_demo(
            str(run / f"checkpoint-{step}"), DemoSpec(params=20_000, tag=f"global_step{step}", steps=step)
        )
    return run


def test_a_sibling_checkpoint_by_name_and_path_at_tag(
    trainer_run: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    here = str(trainer_run / "checkpoint-2")
    one = str(trainer_run / "checkpoint-1")
    assert against_location(here, None, "checkpoint-1") == (one, None)
    assert against_location(here, None, f"{one}@global_step1") == (one, "global_step1")
    assert against_location(here, None, "global_step2") == (here, "global_step2")
    monkeypatch.chdir(trainer_run)
    assert against_location(here, None, "checkpoint-1@global_step1") == ("checkpoint-1", "global_step1")


@pytest.mark.parametrize(
    ("spec", "said"),
    [
        ("global_step1", "no tag of that name in"),  # a tag of another root, named as if it were here
        ("CKPT1@global_step9", "has no tag global_step9"),
        ("CKPT1@../x", "--against names the tag '../x'"),
    ],
)
def test_what_names_nothing_says_against(trainer_run: Path, spec: str, said: str) -> None:
    spec = spec.replace("CKPT1", str(trainer_run / "checkpoint-1"))
    with pytest.raises(NotACheckpointError) as err:
        against_location(str(trainer_run / "checkpoint-2"), None, spec)
    assert said in err.value.message and "--tag" not in err.value.message
    assert "PATH@TAG" in (err.value.hint or "")


def test_cli_compares_across_roots(trainer_run: Path, cli: Any) -> None:
    res = cli("health", trainer_run / "checkpoint-2", "--against", trainer_run / "checkpoint-1", "--json")
    assert res.rc == 0, res.output
    report = json.loads(res.stdout)
    assert report["against"] == "checkpoint-1/global_step1"
    bad = cli("health", trainer_run / "checkpoint-2", "--against", "global_step1")
    assert bad.rc != 0 and "--against global_step1" in bad.output and "Traceback" not in bad.output


def test_cli_same_root_keeps_the_bare_tag(tmp_path: Path, trainer_run: Path, cli: Any) -> None:
    root = tmp_path / "two"
    shutil.copytree(trainer_run / "checkpoint-1", root)
    shutil.copytree(trainer_run / "checkpoint-2" / "global_step2", root / "global_step2")
    res = cli("health", root, "--tag", "global_step2", "--against", "global_step1", "--json")
    assert res.rc == 0, res.output
    assert json.loads(res.stdout)["against"] == "global_step1"
