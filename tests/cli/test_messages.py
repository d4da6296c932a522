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


def test_a_missing_tag_is_called_so(small: Path, cli: Callable[..., CliResult]) -> None:
    """#28 item 13: "No such tag", not "Not a DeepSpeed checkpoint", wherever a tag is asked for."""
    for args in (("scan", small, "--tag", "nope"), ("health", small, "--against", "nope")):
        r = cli(*args)
        assert r.rc == 2
        assert "No such tag" in r.stderr and "Not a DeepSpeed checkpoint" not in r.stderr, r.stderr


def test_json_failures_are_one_json_object(small: Path, tmp_path: Path, cli: Callable[..., CliResult]) -> None:
    for args in (
        ("scan", small, "--tag", "nope", "--json"),
        ("scan", tmp_path / "missing", "--json"),
        ("health", small, "--tag", "nope", "--json"),
        ("preflight", small, "--tag", "nope", "--json"),
    ):
        r = cli(*args)
        assert r.rc == 2, args
        doc = json.loads(r.stdout)  # exactly one object
        assert doc["error"]["title"] and doc["error"]["exit_code"] == 2, args


def test_json_of_a_damaged_preflight_is_one_object(
    small: Path, tmp_path: Path, cli: Callable[..., CliResult]
) -> None:
    r = cli("preflight", truncated_copy(small, tmp_path / "cut"), "--json")
    assert r.rc == 1
    doc = json.loads(r.stdout)
    assert doc["damaged"] and doc["error"]


def test_verify_help_and_another_checkpoint(
    small: Path, tmp_path: Path, cli: Callable[..., CliResult], demo  # type: ignore[no-untyped-def]
) -> None:
    helped = cli("verify", "--help").stdout
    tag_help = helped[helped.index("  --tag TAG") :].split("\n  -")[0]
    assert "latest" not in tag_help and "records" in tag_help
    other = demo(DemoSpec(params=1_000_000, tag="global_step7"))
    out = tmp_path / "out"
    assert cli("convert", other, out).rc == 0
    r = cli("verify", small, out)
    assert r.rc == 2
    assert "another checkpoint" in r.stderr and "no tag" not in r.stderr.lower(), r.stderr


def test_a_mistyped_flag_shows_its_commands_usage(small: Path, cli: Callable[..., CliResult]) -> None:
    r = cli("scan", small, "--jsn")
    assert r.rc == 2
    assert r.stderr.startswith("usage: zero-inspector scan"), r.stderr
    assert "--jsn" in r.stderr


def test_the_busy_folder_hint_names_what_overwrite_replaces(
    demo, tmp_path: Path, cli: Callable[..., CliResult]  # type: ignore[no-untyped-def]
) -> None:
    """--overwrite --format model replaces config.json: the hint says so instead of "other files are left
    alone" alone."""
    from tests.convert.kinds.hf import trainer_run

    run = trainer_run(demo, tmp_path)
    out = tmp_path / "out"
    out.mkdir()
    (out / "config.json").write_text("{}")
    r = cli("convert", run, out, "--format", "model")
    assert r.rc == 2
    hint = r.stderr.split("→")[-1]
    assert "--overwrite" in hint and "config.json" in hint, r.stderr
