"""The arena cap applies on glibc, and a user's MALLOC_ARENA_MAX is left alone."""

from __future__ import annotations

import os
import platform
import subprocess
import sys

import pytest

from inspector.system.malloc import cap_malloc_arenas


def test_a_users_setting_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MALLOC_ARENA_MAX", "8")
    assert cap_malloc_arenas() is False


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt's arena cap is glibc's")
def test_applies_on_glibc_in_a_fresh_process() -> None:
    env = {k: v for k, v in os.environ.items() if k != "MALLOC_ARENA_MAX"}
    code = "from inspector.system.malloc import cap_malloc_arenas as c; print(c())"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env)
    assert out.stdout.strip() == "True"
