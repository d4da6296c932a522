"""The environment the benchmarks run the CLI in: this checkout's package with its bytecode compiled, as a
pip-installed package has it. A shell with `PYTHONDONTWRITEBYTECODE` set would otherwise compile every module
of ours in every child, ~0.15-0.3 CPU-s a run that no user pays and that hides a per-file cost behind a
larger first row. (Not `PYTHONPYCACHEPREFIX`: Python would then ignore the `__pycache__` that pip wrote for
numpy, torch and deepspeed, and the first run of each would compile them.)"""

from __future__ import annotations

import compileall
import functools
import os
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


@functools.cache
def _compiled() -> None:
    """The package compiled into its `__pycache__` once, before any child is measured."""
    compileall.compile_dir(str(REPO / "inspector"), quiet=1)


def child_env() -> dict[str, str]:
    """os.environ with the checkout on the path, its bytecode compiled and kept."""
    _compiled()
    env = dict(os.environ, PYTHONPATH=str(REPO))
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env.pop("PYTHONPYCACHEPREFIX", None)
    return env
