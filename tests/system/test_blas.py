"""One BLAS thread: numpy loaded after the call starts no BLAS pool; a user's setting, or numpy already
loaded, is left alone."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from inspector.system.blas import SETTINGS, one_blas_thread

THREADS = (
    "import os, sys; from inspector.system.blas import one_blas_thread as o; "
    "applied = o() if sys.argv[1] == 'call' else None; import numpy; "
    "print(applied, len(os.listdir('/proc/self/task')))"
)


def _fresh(mode: str) -> tuple[str, int]:
    env = {k: v for k, v in os.environ.items() if k not in SETTINGS}
    out = subprocess.run(
        [sys.executable, "-c", THREADS, mode], capture_output=True, text=True, check=True, env=env
    ).stdout.split()
    return out[0], int(out[1])


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="counts threads in /proc")
def test_numpy_loaded_after_it_starts_no_blas_threads() -> None:
    applied, threads = _fresh("call")
    assert applied == "True"
    assert threads == 1
    if (os.cpu_count() or 1) > 1:  # the control: without the call, OpenBLAS starts its pool here
        assert _fresh("none")[1] > 1


def test_a_users_setting_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OMP_NUM_THREADS", "4")
    monkeypatch.delenv("OPENBLAS_NUM_THREADS", raising=False)
    assert one_blas_thread() is False
    assert "OPENBLAS_NUM_THREADS" not in os.environ


def test_too_late_once_numpy_is_loaded(monkeypatch: pytest.MonkeyPatch) -> None:
    import numpy  # noqa: F401  (loaded: its BLAS pool is already what it is)

    for k in SETTINGS:
        monkeypatch.delenv(k, raising=False)
    assert one_blas_thread() is False
    assert "OPENBLAS_NUM_THREADS" not in os.environ
