"""CLI contract: exit codes, --version, one message per error on stderr, a closed stdout pipe."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from inspector import __version__
from inspector.demo.writer import DemoSpec

if TYPE_CHECKING:
    from conftest import CliResult, DemoCache

REPO_ROOT = Path(__file__).resolve().parents[2]
SPEC = DemoSpec(stage=2, world_size=2, dtype="bf16", params=50_000)


def test_version(cli: Callable[..., CliResult]) -> None:
    res = cli("--version")
    assert res.rc == 0 and res.stdout.strip() == f"zero-inspector {__version__}"


def closed_pipe_run(*args: str | os.PathLike[str]) -> tuple[int, str]:
    """Run the CLI with a stdout pipe whose reader is gone before the first write (`| head -0`)."""
    env = dict(os.environ, COLUMNS="120", NO_COLOR="1", TERM="dumb", PYTHONPATH=str(REPO_ROOT))
    proc = subprocess.Popen(
        [sys.executable, "-m", "inspector", *(os.fspath(a) for a in args)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
        cwd=REPO_ROOT,
    )
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()
    err = proc.stderr.read().decode()
    return proc.wait(timeout=120), err


@pytest.mark.parametrize("damaged", [False, True], ids=["healthy", "damaged"])
@pytest.mark.parametrize("fmt", [(), ("--json",)], ids=["rich", "json"])
def test_closed_stdout_keeps_the_verdict(
    tmp_path: Path, demo: DemoCache, damaged: bool, fmt: tuple[str, ...]
) -> None:
    """`scan X | head -1`: the exit code is the checkpoint's (0 healthy, 1 damaged), never a traceback."""
    root = demo.copy(SPEC, tmp_path / "ckpt")
    if damaged:
        (root / "global_step3" / "bf16_zero_pp_rank_1_mp_rank_00_optim_states.pt").unlink()
    rc, err = closed_pipe_run("scan", root, *fmt)
    assert rc == (1 if damaged else 0), err
    assert "Traceback" not in err and "BrokenPipe" not in err and "Exception ignored" not in err, err


def test_damaged_is_exit_1_for_every_command(
    tmp_path: Path, demo: DemoCache, cli: Callable[..., CliResult]
) -> None:
    """A missing rank file: scan, preflight, convert all exit 1 and name the problem once, on stderr."""
    root = demo.copy(SPEC, tmp_path / "ckpt")
    (root / "global_step3" / "bf16_zero_pp_rank_1_mp_rank_00_optim_states.pt").unlink()
    out = tmp_path / "out"
    for args in (("scan", root), ("preflight", root), ("preflight", root, "--json"), ("convert", root, out)):
        res = cli(*args)
        assert res.rc == 1, (args, res.output)
        assert "Traceback" not in res.output
        assert "DP rank 1 is missing" in res.output, res.output
    res = cli("convert", root, out)
    assert res.stderr.count("Damaged checkpoint") == 1 and "Damaged checkpoint" not in res.stdout
    assert not out.exists()


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (("--params", "abc"), "--params 'abc'"),
        (("--params", "-5"), "--params '-5'"),
        (("--params", "0"), "--params must be between 1"),
        (("--world-size", "0"), "--world-size must be between 1 and 8192; got 0"),
        (("--world-size", "-2"), "--world-size must be between 1 and 8192; got -2"),
        (("--world-size", "8193"), "--world-size must be between 1 and 8192; got 8193"),
        (("--sub-group-size", "0"), "--sub-group-size must be positive"),
        (("--layers", "0"), "--layers must be between 1 and 1,024; got 0"),
        (("--layers", "1025"), "--layers must be between 1 and 1,024; got 1025"),
        (("--bf16-optimizer", "--stage", "2"), "--bf16-optimizer exists only for --stage 1"),
    ],
)
def test_demo_validates_its_arguments(
    tmp_path: Path, cli: Callable[..., CliResult], args: tuple[str, ...], needle: str
) -> None:
    """Bad demo options: exit 2, one clear message, no traceback, nothing created (issue 7.7)."""
    out = tmp_path / "demo"
    res = cli("demo", out, *args)
    assert res.rc == 2, res.output
    assert "Traceback" not in res.output and "Invalid demo options" in res.stderr
    assert needle in res.stderr, res.stderr
    assert not out.exists()


def test_demo_checks_free_disk_first(tmp_path: Path, cli: Callable[..., CliResult]) -> None:
    import shutil

    if shutil.disk_usage(tmp_path).free > 1_000_000_000_000:
        pytest.skip("this disk could hold a 90G-parameter demo")
    out = tmp_path / "demo"
    res = cli("demo", out, "--params", "90G")
    assert res.rc == 2 and "Disk full" in res.stderr and "free" in res.stderr, res.output
    assert not out.exists()


@pytest.mark.parametrize("exc", [KeyboardInterrupt, OSError(28, "No space left on device")])
def test_demo_cleans_up_on_any_exit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, exc: BaseException
) -> None:
    """Interrupted (Ctrl-C, SIGTERM) or failing half-way: the files it wrote are removed, a folder it
    found is kept."""
    import inspector.demo.writer as writer
    from inspector.cli.main import main

    real = writer.write_demo

    def half(out_dir: str, spec: DemoSpec, progress: Callable[[str], None] | None = None) -> str:
        real(out_dir, spec)
        raise exc

    monkeypatch.setattr(writer, "write_demo", half)
    new = tmp_path / "new" / "demo"
    assert main(["demo", str(new), "--params", "20000"]) in (2, 130)
    assert not new.exists()
    found = tmp_path / "found"
    found.mkdir()
    (found / "keep.txt").write_text("x")
    assert main(["demo", str(found), "--params", "20000", "--overwrite"]) in (2, 130)
    assert os.listdir(found) == ["keep.txt"]


def test_a_mistyped_command_is_named_with_a_suggestion(cli: Callable[..., CliResult], tmp_path: Path) -> None:
    """`scna DIR` is an unknown command near `scan`, said on the terminal (not "unrecognized arguments")."""
    res = cli("scna", str(tmp_path))
    assert res.rc == 2
    assert "neither a command nor a path" in res.stderr and "zero-inspector scan" in res.stderr
    assert "unrecognized arguments" not in res.stderr


def test_a_usage_error_quotes_what_was_typed_on_one_line(
    cli: Callable[..., CliResult], tmp_path: Path
) -> None:
    """An unknown flag with a newline and an escape sequence in it (a pasted name, a script's variable) is
    quoted escaped on the error's one line: nothing typed can start a line of its own or reach the terminal
    as a control."""
    res = cli("scan", str(tmp_path), "--bad\x1b[2J\nINJECTED: ok")
    assert res.rc == 2
    assert "\x1b" not in res.stderr and not any(ln.startswith("INJECTED") for ln in res.stderr.splitlines())
    assert "unrecognized arguments: --bad\\x1b[2J\\nINJECTED: ok" in res.stderr, res.stderr


def test_a_missing_path_is_refused_on_the_terminal(cli: Callable[..., CliResult], tmp_path: Path) -> None:
    """`zero-inspector foo` says it on the terminal with exit 2 instead of opening the app on a dialog."""
    res = cli(str(tmp_path / "foo"))
    assert res.rc == 2 and "does not exist" in res.stderr and "Traceback" not in res.stderr


def test_scan_of_a_run_folder_names_the_checkpoints_inside(
    cli: Callable[..., CliResult], demo: DemoCache, tmp_path: Path
) -> None:
    """A Lightning run folder is not a checkpoint itself; the refusal names the `last.ckpt/` it holds."""
    run = tmp_path / "lightning-run"
    demo.copy(SPEC, run / "last.ckpt")
    res = cli("scan", str(run))
    assert res.rc != 0 and "last.ckpt" in res.stderr, res.stderr
    assert cli("scan", str(run / "last.ckpt")).rc == 0


def test_demo_and_preflight_help_document_every_option() -> None:
    """Every argument of `demo` and `preflight` says what it does in --help."""
    import argparse

    from inspector.cli.main import build_parser

    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    for name in ("demo", "preflight"):
        for action in sub.choices[name]._actions:
            assert action.help, f"{name} {action.option_strings or action.dest} has no help"
