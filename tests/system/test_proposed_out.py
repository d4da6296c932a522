"""Where an export goes when none is named (issue 42): beside the checkpoint, else in the user's home; the
app's Export form and `preflight` without OUT propose the same folder."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from inspector.system.disk import proposed_out


def test_beside_the_checkpoint_not_the_current_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = tmp_path / "runs" / "llama"
    run.mkdir(parents=True)
    elsewhere = tmp_path / "a-git-clone"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    assert proposed_out(str(run), "global_step3") == str(tmp_path / "runs" / "llama-global_step3-safetensors")
    ckpt = tmp_path / "runs" / "b" / "checkpoint"  # a generic name takes its parent's
    ckpt.mkdir(parents=True)
    assert proposed_out(str(ckpt), "s1") == str(tmp_path / "runs" / "b" / "b-checkpoint-s1-safetensors")


@pytest.mark.skipif(os.geteuid() == 0, reason="root may write into a read-only folder")
def test_home_when_beside_is_not_writable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    parent = tmp_path / "shared"
    (parent / "llama").mkdir(parents=True)
    parent.chmod(0o555)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    try:
        assert proposed_out(str(parent / "llama"), "s1") == str(tmp_path / "home" / "llama-s1-safetensors")
    finally:
        parent.chmod(0o755)


def test_home_for_a_bucket(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    assert proposed_out("s3://bucket/runs/checkpoint", "s1") == str(tmp_path / "checkpoint-s1-safetensors")


def test_home_when_beside_is_read_only_by_kernel_answer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same rule whoever runs it: the folder beside is judged by `unwritable` (statvfs, access)."""
    from inspector.system import disk

    (tmp_path / "runs" / "llama").mkdir(parents=True)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setattr(disk, "unwritable", lambda p: f"{p} is on a read-only file system")
    assert proposed_out(str(tmp_path / "runs" / "llama"), "s1") == str(
        tmp_path / "home" / "llama-s1-safetensors"
    )


def test_app_and_cli_propose_the_same_folder(demo, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    """`preflight` without --out assesses the folder the Export form proposes."""
    import argparse

    from inspector.cli import jobs
    from inspector.cli.preflight import cmd_preflight
    from inspector.demo.writer import DemoSpec
    from inspector.tui.session import ExportSettings

    root = demo(DemoSpec(params=200_000))
    seen: list[str | None] = []
    real = jobs.plan_job

    def spy(args: argparse.Namespace, *, allow_damaged: bool, out: str | None = None, **kw):  # type: ignore[no-untyped-def]
        seen.append(out)
        return real(args, allow_damaged=allow_damaged, out=out, **kw)

    monkeypatch.setattr(jobs, "plan_job", spy)
    monkeypatch.chdir(tmp_path)
    from inspector.cli.main import build_parser

    args = build_parser().parse_args(["preflight", str(root), "--json"])
    cmd_preflight(args)
    from inspector.scan.scanner import scan

    ckpt = scan(str(root))
    assert seen == [ExportSettings.default_out(ckpt.root, ckpt.tag)]
    assert not seen[0].startswith(str(tmp_path))  # not the current folder
