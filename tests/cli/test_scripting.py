"""What a script meets: a cheap `--version`/`--help`, no app without a terminal, one JSON object from every
command that reports (and from every failure under `--json`), "did you mean" for flags, whole names off a
terminal, shell completion from the parser itself."""

from __future__ import annotations

import json
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
HEAVY = ("numpy", "ml_dtypes", "textual", "rich.live", "rich.progress", "torch")


def _loaded_by(argv: list[str]) -> tuple[int, set[str]]:
    """The modules a CLI run loaded, in a fresh interpreter (the exit code too)."""
    code = (
        "import sys\nfrom inspector.cli.main import main\n"
        f"try:\n    rc = main({argv!r})\nexcept SystemExit as e:\n    rc = e.code\n"
        "print('\\n'.join(sys.modules), file=sys.stderr)\nprint('RC', rc, file=sys.stderr)\n"
    )
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT), NO_COLOR="1")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    lines = proc.stderr.split()
    return int(lines[lines.index("RC") + 1]), set(lines)


@pytest.mark.parametrize("argv", [["--version"], ["-V"], ["--help"], ["convert", "--help"]])
def test_version_and_help_load_no_heavy_module(argv: list[str]) -> None:
    """--version and --help are what a script or a shell probes first: no numpy, ml_dtypes, UI or torch."""
    rc, loaded = _loaded_by(argv)
    assert rc == 0 and "inspector.cli.main" in loaded
    heavy = {m for m in loaded if m.split(".")[0] in HEAVY or m in HEAVY}
    if argv == ["convert", "--help"]:  # convert's help names the output kinds, which need numpy
        heavy -= {m for m in heavy if m.split(".")[0] in ("numpy", "ml_dtypes")}
    assert not heavy, sorted(heavy)


def test_scan_never_loads_the_app(demo: DemoCache) -> None:
    rc, loaded = _loaded_by(["scan", str(demo(SPEC)), "--json"])
    assert rc == 0 and "inspector.scan.scanner" in loaded
    assert not {m for m in loaded if m.split(".")[0] == "textual"}


def test_short_version_flag(cli: Callable[..., CliResult]) -> None:
    res = cli("-V")
    assert res.rc == 0 and res.stdout.strip() == f"zero-inspector {__version__}"


@pytest.mark.parametrize("argv", [["{root}"], ["open", "{root}"], ["--demo"]])
def test_the_app_refuses_without_a_terminal(demo: DemoCache, argv: list[str]) -> None:
    """stdin and stdout not terminals (a CI job): a clear refusal naming `scan`, no screen switch, no hang."""
    args = [a.format(root=demo(SPEC)) for a in argv]
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT), NO_COLOR="1", COLUMNS="200")
    proc = subprocess.run(
        [sys.executable, "-m", "inspector", *args],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        env=env,
        timeout=60,  # a hang guard only: the refusal comes before any UI import
    )
    assert proc.returncode == 2
    assert b"\x1b[?1049h" not in proc.stdout + proc.stderr
    assert b"No terminal" in proc.stderr and b"zero-inspector scan" in proc.stderr


def _one_object(text: str) -> dict[str, object]:
    doc = json.loads(text)  # the whole of stdout: exactly one JSON document
    assert isinstance(doc, dict)
    return doc


def test_convert_and_verify_json_print_one_object(
    demo: DemoCache, tmp_path: Path, cli: Callable[..., CliResult]
) -> None:
    root, out = demo(SPEC), tmp_path / "out"
    res = cli("convert", root, out, "--dtype", "bf16", "--json")
    assert res.rc == 0, res.stderr
    report = _one_object(res.stdout)
    assert report["tensors"] and report["bytes_written"] and report["files"]
    assert "Done" in res.stderr  # the human summary still goes to stderr
    res = cli("verify", root, out, "--json")
    assert res.rc == 0, res.stderr
    result = _one_object(res.stdout)
    assert result["ok"] is True and result["checked"] == report["tensors"]


@pytest.mark.parametrize(
    "argv",
    [
        ["scan", "--json"],  # the path is missing
        ["verify", "{root}", "--json", "--no-such-flag"],
        ["convert", "{root}", "--json"],  # OUT is missing
        ["health", "{root}", "--json", "--workers", "0"],
        ["scna", "--json"],
        ["verify", "{root}", "out", "--json", "--progress", "json"],  # two JSON shapes on one stdout
    ],
)
def test_usage_errors_under_json_are_one_object(
    demo: DemoCache, cli: Callable[..., CliResult], argv: list[str]
) -> None:
    res = cli(*[a.format(root=demo(SPEC)) for a in argv])
    assert res.rc == 2
    error = _one_object(res.stdout)["error"]
    assert isinstance(error, dict) and error["message"] and error["exit_code"] == 2
    assert res.stderr  # and the message for people, as without --json


def test_a_mistyped_flag_gets_the_nearest(demo: DemoCache, cli: Callable[..., CliResult]) -> None:
    res = cli("scan", demo(SPEC), "--jsn")
    assert res.rc == 2 and "did you mean" in res.stderr and "--jsn → --json" in res.stderr
    res = cli("convert", demo(SPEC), "out", "--dtpe", "bf16")
    assert res.rc == 2 and "--dtpe → --dtype" in res.stderr


def test_names_are_whole_off_a_terminal(demo: DemoCache) -> None:
    """A pipe with no COLUMNS: Rich would assume 80 columns and cut or fold the rank files' names."""
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    env.update(PYTHONPATH=str(REPO_ROOT), NO_COLOR="1", TERM="dumb")
    root = demo(DemoSpec(stage=3, world_size=2, dtype="bf16", params=50_000))
    for command in ("scan", "health"):
        proc = subprocess.run(
            [sys.executable, "-m", "inspector", command, str(root)],
            capture_output=True,
            text=True,
            env=env,
            timeout=120,
        )
        assert proc.returncode == 0, proc.stderr
        assert "…" not in proc.stdout, proc.stdout
        if command == "scan":
            for f in sorted(p.name for p in root.rglob("*.pt")):
                assert f in proc.stdout, f


def test_completion_without_argcomplete_says_how() -> None:
    """argcomplete is an optional extra: without it, `completion` says how to install it (exit 2)."""
    code = """
import sys
class _NoArgcomplete:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "argcomplete":
            raise ImportError("blocked for the test")
sys.meta_path.insert(0, _NoArgcomplete())
from inspector.cli.main import main
sys.exit(main(["completion", "bash"]))
"""
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT), NO_COLOR="1", COLUMNS="200")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)
    assert proc.returncode == 2 and "zero-inspector[completion]" in proc.stderr, proc.stderr


@pytest.mark.parametrize("shell", ["bash", "zsh", "fish"])
def test_completion_hooks(cli: Callable[..., CliResult], shell: str) -> None:
    pytest.importorskip("argcomplete")
    res = cli("completion", shell)
    assert res.rc == 0 and "zero-inspector" in res.stdout


def test_completion_answers_from_the_parser(tmp_path: Path) -> None:
    """What the hook asks at a tab: the flags of the command being typed, from the full parser."""
    pytest.importorskip("argcomplete")
    line = "zero-inspector verify ckpt out --js"
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join([str(REPO_ROOT), *sys.path]),  # where this test found argcomplete
        _ARGCOMPLETE="1",
        _ARGCOMPLETE_IFS="\n",
        COMP_LINE=line,
        COMP_POINT=str(len(line)),
        _ARGCOMPLETE_STDOUT_FILENAME=str(tmp_path / "answer"),
    )
    subprocess.run([sys.executable, "-m", "inspector"], env=env, timeout=120, check=False)
    assert "--json" in (tmp_path / "answer").read_text().split()


def test_a_logged_conversion_ends_at_100_percent_in_one_unit_family(
    demo: DemoCache, tmp_path: Path, cli: Callable[..., CliResult]
) -> None:
    """Off a terminal: the last progress line is where the run ended, sizes and rates are both binary
    (MiB with MiB/s), and "Done in" is the command's own duration, never a rounded-away "0.0 s"."""
    res = cli("convert", demo(SPEC), tmp_path / "out", "--dtype", "bf16")
    assert res.rc == 0, res.output
    progress = [line for line in res.stdout.splitlines() if line.startswith("[")]
    assert progress and progress[-1].startswith("[100.0%]"), progress
    assert "MB/s" not in res.stdout and "iB/s" in res.stdout
    done = next(line for line in res.stdout.splitlines() if line.startswith("Done in"))
    assert "0.0 s" not in done and " written at " in done


@pytest.mark.skipif(not os.path.isdir("/sys/kernel"), reason="needs sysfs")
def test_preflight_probes_writability_truthfully(demo: DemoCache, cli: Callable[..., CliResult]) -> None:
    """sysfs refuses new folders whatever its modes say (and root passes every mode check)."""
    res = cli("preflight", demo(SPEC), "--out", "/sys/kernel/zi-probe", "--json")
    doc = _one_object(res.stdout)
    assert res.rc == 3 and doc["output_writable"] is False, doc
    assert "does not accept new files" in str(doc["problem"]) or "not writable" in str(doc["problem"])
