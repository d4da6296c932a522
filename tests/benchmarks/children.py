"""The environment the benchmarks run the CLI in: this checkout's package with its bytecode compiled once
and kept (`PYTHONPYCACHEPREFIX`), as a pip-installed package has it. A shell with `PYTHONDONTWRITEBYTECODE`
set would otherwise compile every module in every child, ~0.15-0.3 CPU-s a run that no user pays and that
hides a per-file cost behind a larger first row."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PYCACHE = Path(tempfile.gettempdir()) / "zero-inspector-bench-pycache"


def child_env() -> dict[str, str]:
    """os.environ with the checkout on the path and bytecode written to, and read from, PYCACHE."""
    env = dict(os.environ, PYTHONPATH=str(REPO), PYTHONPYCACHEPREFIX=str(PYCACHE))
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    return env
