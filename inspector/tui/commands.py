"""The app's command-palette entries and the demo writer's child process (helpers of tui/app.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterable, Iterator
from typing import Any

from textual.app import SystemCommand


def textual_commands(commands: Iterable[SystemCommand]) -> Iterator[SystemCommand]:
    """Textual's own entries; its side panel renamed, since ours (below) is the full list of keys and both
    were called "Keys"."""
    for cmd in commands:
        yield cmd._replace(title="Key panel") if cmd.title == "Keys" else cmd


def app_commands(app: Any) -> Iterator[SystemCommand]:
    """`ctrl+p`: the app's actions, after Textual's own (themes, quit, ...)."""
    yield SystemCommand(
        "Export options", "Output folder, dtype, shard size, renames; live preflight", app.action_export
    )
    yield SystemCommand(
        "Convert", "Convert with the export options (any format) in a child process", app.action_convert
    )
    yield SystemCommand(
        "Overview", "Summary, ranks, tags and findings", lambda: app.main.show_tab("overview")
    )
    yield SystemCommand(
        "Tensors", "Module tree, selection and tensor detail", lambda: app.main.show_tab("tensors")
    )
    yield SystemCommand(
        "Health check",
        "Every tensor's NaN/Inf, norms and moments, in the background (also h)",
        lambda: app.main.action_health(),
    )
    yield SystemCommand(
        "Statistics of the focused tensor",
        "min, max, mean, std, NaN/Inf, histogram",
        lambda: app.main.tensors_pane.action_stats(),
    )
    yield SystemCommand("Select all tensors", "Export everything", lambda: app.main.select("all"))
    yield SystemCommand("Select no tensors", "Start an empty selection", lambda: app.main.select("none"))
    yield SystemCommand("Next tag", "Open the next (newer) tag", lambda: app.action_tag(1))
    yield SystemCommand("Previous tag", "Open the previous (older) tag", lambda: app.action_tag(-1))
    yield SystemCommand("Help: every key", "Every key of the app, by screen (also ?)", app.action_help)


def write_demo_checkpoint(path: str, params: str) -> str:
    """Write a demo checkpoint in a child process: hundreds of MB of numpy work would stall the UI.

    Returns "" on success, else what went wrong."""
    from inspector.tui.child import REPO_ROOT

    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join(p for p in (REPO_ROOT, os.environ.get("PYTHONPATH")) if p)
    )
    proc = subprocess.run(
        [sys.executable, "-m", "inspector", "demo", path, "--params", params],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    if proc.returncode:
        return proc.stderr.strip()[-500:] or "the demo writer failed"
    return ""
