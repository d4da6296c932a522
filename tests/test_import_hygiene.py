"""The core must not import the UI stack: scanning and converting work in scripts, tests and workers."""

from __future__ import annotations

import subprocess
import sys

CORE = ["inspector.scan.scanner", "inspector.convert.plan", "inspector.convert.engine", "inspector.convert.verify", "inspector.convert.preflight",
        "inspector.demo.writer", "inspector.system.limits", "inspector.system.rss", "inspector.system.units", "inspector.scan.summary"]


def _modules_after_import(mod: str) -> set[str]:
    code = f"import sys, {mod}; print('\\n'.join(sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    return set(out.split())


def test_core_imports_no_ui() -> None:
    loaded = _modules_after_import(", ".join(CORE))
    assert "inspector.convert.engine" in loaded  # the probe really imported the core
    assert not {"textual", "rich"} & loaded, f"the core pulls in {sorted({'textual', 'rich'} & loaded)}"


def test_scanning_needs_neither_torch_nor_deepspeed() -> None:
    """scan stays fast (torch costs ~2 s to import) and works where deepspeed is not installed."""
    loaded = _modules_after_import("inspector.scan.scanner")
    assert "torch" not in loaded
    assert "deepspeed" not in loaded
