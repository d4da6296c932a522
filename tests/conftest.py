"""Shared fixtures: demo checkpoints written once per session (cached by spec) and a CLI runner.

Nothing here imports deepspeed: the unit suite must pass in a venv without it. `_no_deepspeed_import`
fails the session if any test (or the inspector code it drives) pulls deepspeed into this process.
"""

from __future__ import annotations

import ctypes
import os
import resource
import shutil
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NamedTuple

import pytest

from inspector.demo.writer import DemoSpec, write_demo

REPO_ROOT = Path(__file__).resolve().parents[1]
CLI_TIMEOUT = 120


class CliResult(NamedTuple):
    """What one `python -m inspector ...` run produced; unpacks as (rc, stdout, stderr)."""

    rc: int
    stdout: str
    stderr: str

    @property
    def output(self) -> str:
        """stdout and stderr together, for "the message is somewhere" checks."""
        return self.stdout + "\n" + self.stderr


# prctl(PR_CAPBSET_DROP, cap): CAP_DAC_OVERRIDE (1) and CAP_DAC_READ_SEARCH (2) let root ignore file modes
_PR_CAPBSET_DROP, _DAC_CAPS = 24, (1, 2)


def _without_root_file_access() -> None:
    """In the child, before exec: drop the capabilities that let root read any file, so a file's mode binds
    the child as it binds a user (the CLI itself then runs with no way to regain them)."""
    libc = ctypes.CDLL(None, use_errno=True)
    for cap in _DAC_CAPS:
        if libc.prctl(_PR_CAPBSET_DROP, cap, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_CAPBSET_DROP)")


def _address_space_limit(nbytes: int) -> Callable[[], None]:
    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (nbytes, nbytes))

    return limit


def cli_env() -> dict[str, str]:
    """The environment a CLI child runs in: this repository first on its path; wide, colourless, UTF-8
    output, so no message is wrapped or styled."""
    env = dict(os.environ, COLUMNS="400", LINES="200", NO_COLOR="1", TERM="dumb", PYTHONUTF8="1")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH", "")) if p)
    return env


def run_cli(
    *args: str | os.PathLike[str],
    timeout: float = CLI_TIMEOUT,
    memory_limit: int | None = None,
    file_modes_bind: bool = False,
) -> CliResult:
    """Run the CLI in a fresh interpreter; wide, colourless output so messages are not wrapped.

    `memory_limit` caps the child's address space (bytes), so a memory bomb fails fast instead of swapping.
    `file_modes_bind`: when running as root (CI does), the child loses root's right to read any file, so a
    permission test means there what it means for a user.
    """
    preexec = _address_space_limit(memory_limit) if memory_limit else None
    if file_modes_bind and os.geteuid() == 0:
        preexec = _without_root_file_access if preexec is None else _both(preexec, _without_root_file_access)
    env = cli_env()
    proc = subprocess.run(
        [sys.executable, "-m", "inspector", *(os.fspath(a) for a in args)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        cwd=REPO_ROOT,
        check=False,
        preexec_fn=preexec,
    )
    return CliResult(proc.returncode, proc.stdout, proc.stderr)


def _both(first: Callable[[], None], second: Callable[[], None]) -> Callable[[], None]:
    def run() -> None:
        first()
        second()

    return run


@pytest.fixture(scope="session")
def cli() -> Callable[..., CliResult]:
    """`cli("scan", path, "--json")` -> CliResult(rc, stdout, stderr)."""
    return run_cli


class DemoCache:
    """Writes each distinct DemoSpec once per session (per xdist worker) and hands out its root."""

    def __init__(self, factory: pytest.TempPathFactory) -> None:
        self._factory = factory
        self._roots: dict[DemoSpec, Path] = {}
        self._lock = threading.Lock()

    def __call__(self, spec: DemoSpec) -> Path:
        """The root folder (holding `latest`) of a demo checkpoint for `spec`. Treat it as read-only."""
        with self._lock:
            root = self._roots.get(spec)
            if root is None:
                root = self._factory.mktemp(f"demo-s{spec.stage}-ws{spec.world_size}-{spec.dtype}")
                write_demo(str(root), spec)
                self._roots[spec] = root
            return root

    def copy(self, spec: DemoSpec, dest: Path) -> Path:
        """A private, writable copy of the demo for `spec` at `dest` (for tests that damage files)."""
        shutil.copytree(self(spec), dest, symlinks=True)
        return dest


@pytest.fixture(scope="session")
def demo(tmp_path_factory: pytest.TempPathFactory) -> DemoCache:
    """`demo(DemoSpec(...))` -> cached root; `demo.copy(spec, tmp_path / "x")` -> writable copy."""
    return DemoCache(tmp_path_factory)


@pytest.fixture
def fresh_format_caches() -> Iterator[None]:
    """The pickle templates, rank-archive layouts and records a scan learns (`format/replay.py`,
    `format/rankrepeat.py`, `parse/reparse.py`) forgotten before and after a test that counts what they do or compares a scan with them and without."""
    from inspector.format import rankrepeat, replay
    from inspector.parse import reparse

    replay.forget()
    rankrepeat._LAYOUTS.clear()
    reparse.forget()
    yield
    replay.forget()
    rankrepeat._LAYOUTS.clear()
    reparse.forget()


@pytest.fixture(scope="session", autouse=True)
def _no_deepspeed_import() -> Iterator[None]:
    """The unit suite runs without deepspeed; importing it anywhere in-process is a bug."""
    already = "deepspeed" in sys.modules
    yield
    if not already:
        leaked = sorted(m for m in sys.modules if m == "deepspeed" or m.startswith("deepspeed."))
        assert not leaked, f"deepspeed was imported during the unit tests: {leaked[:5]}"


def pt_save(obj: Any, path: str | os.PathLike[str], chunk_elems: int = 1 << 22) -> None:
    """Write `obj` as torch.save would, straight to `path` (tests build hostile files by hand; the tool itself
    writes only through an OutputRoot)."""
    from inspector.format import ptwriter as pw

    with open(path, "wb") as fh:
        pw.dump(obj, fh, os.path.splitext(os.path.basename(os.fspath(path)))[0], chunk_elems=chunk_elems)


@pytest.fixture(autouse=True)
def _private_state_folder(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every test gets its own `$XDG_STATE_HOME`: the app saves named selections there, and no test may
    read the user's own file (snapshots would depend on it) or write into it."""
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path_factory.mktemp("state")))
