"""The README and docs/ link only to files that ship with the repository; every `zero-inspector ...` command
the README shows still parses; README's test command is the one `.ci/run` runs."""

from __future__ import annotations

import re
import shlex
import subprocess
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
PAGES = ["README.md", "CONTRIBUTING.md", *sorted(f"docs/{p.name}" for p in (REPO_ROOT / "docs").glob("*.md"))]


def tracked() -> set[str]:
    out = subprocess.run(
        ["git", "ls-files"], cwd=REPO_ROOT, capture_output=True, text=True, check=False
    ).stdout.split()
    return set(out) or {str(p.relative_to(REPO_ROOT)) for p in REPO_ROOT.rglob("*") if p.is_file()}


@pytest.mark.parametrize("page", PAGES)
def test_links_resolve_to_shipped_files(page: str) -> None:
    text = (REPO_ROOT / page).read_text()
    links = [t for t in re.findall(r"\]\(([^)#\s]+)\)", text) if "://" not in t]
    files = tracked()
    here = (REPO_ROOT / page).parent
    missing = [t for t in links if str((here / t).resolve().relative_to(REPO_ROOT)) not in files]
    assert not missing, missing
    assert "shared/" not in text  # the project's working notes are not part of the repository


def test_readme_links_every_docs_page() -> None:
    text = (REPO_ROOT / "README.md").read_text()
    unlinked = [p for p in PAGES if p.startswith("docs/") and f"]({p})" not in text]
    assert not unlinked, unlinked


def readme_commands() -> list[str]:
    """Every `zero-inspector ...` command in README's shell blocks (one per `&&`, `|` or `;` part)."""
    text = (REPO_ROOT / "README.md").read_text()
    commands = []
    for block in re.findall(r"```bash\n(.*?)```", text, re.S):
        for line in block.splitlines():
            line = re.sub(r"\$\((.*?)\)", r"\1", line)  # `eval "$(zero-inspector completion bash)"`
            for part in re.split(r"&&|\||;|>", line):
                words = shlex.split(part, comments=True)
                while words and re.match(r"^\w+=", words[0]):  # NO_COLOR=1 zero-inspector ...
                    words = words[1:]
                words = shlex.split(words[1]) if words[:1] == ["eval"] and len(words) == 2 else words
                if words[:1] == ["zero-inspector"]:
                    commands.append(shlex.join(words))
    return commands


def test_readme_shows_every_command() -> None:
    shown = {shlex.split(c)[1] for c in readme_commands() if len(shlex.split(c)) > 1}
    assert {"scan", "preflight", "convert", "verify", "health", "demo", "completion", "--demo"} <= shown, (
        shown
    )


@pytest.mark.parametrize("command", readme_commands())
def test_readme_commands_parse(command: str) -> None:
    """Each command through the real parser (and `zero-inspector PATH` through its routing to `open`)."""
    from inspector.cli.main import _route, build_parser

    argv = _route(shlex.split(command)[1:])
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as exc:
        assert exc.code == 0, f"{command!r} does not parse"  # --help and --version exit 0
        return
    assert args.command


def test_readme_test_command_is_what_ci_runs() -> None:
    readme = (REPO_ROOT / "README.md").read_text()
    ci = [line for line in (REPO_ROOT / ".ci" / "run").read_text().splitlines() if line.startswith("pip ")]
    assert len(ci) == 1 and ci[0] in readme, ci
