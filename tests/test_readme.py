"""The README links only to files that ship with the repository."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]


def tracked() -> set[str]:
    out = subprocess.run(
        ["git", "ls-files"], cwd=REPO_ROOT, capture_output=True, text=True, check=False
    ).stdout.split()
    return set(out) or {str(p.relative_to(REPO_ROOT)) for p in REPO_ROOT.rglob("*") if p.is_file()}


def test_readme_links_resolve_to_shipped_files() -> None:
    text = (REPO_ROOT / "README.md").read_text()
    links = [t for t in re.findall(r"\]\(([^)#\s]+)\)", text) if "://" not in t]
    assert links
    files = tracked()
    missing = [t for t in links if t not in files]
    assert not missing, missing
    assert "shared/" not in text  # the project's working notes are not part of the repository
