"""The command line raises its soft descriptor limit toward the hard one (a pool then holds every rank's file
open); the library alone never changes it, and nothing lowers it. Each case runs in a fresh process started
with a low soft limit, so this one's limits are never touched."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

resource = pytest.importorskip("resource")

LOW = 64


def _limits_after(code: str) -> tuple[int, int, int]:
    """(soft before, soft after, hard) in a child whose soft limit starts at LOW and runs `code`."""
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    if hard != resource.RLIM_INFINITY and hard <= LOW:
        pytest.skip(f"the hard descriptor limit ({hard}) leaves nothing to raise")

    def low() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (LOW, hard))

    script = (
        "import resource, sys\n"
        "before = resource.getrlimit(resource.RLIMIT_NOFILE)[0]\n"
        f"{code}\n"
        "after, hard = resource.getrlimit(resource.RLIMIT_NOFILE)\n"
        "print(before, after, hard)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True, preexec_fn=low, env=os.environ
    )
    before, after, got_hard = (int(w) for w in out.stdout.split()[-3:])
    return before, after, got_hard


def _expected(hard: int, want: int) -> int:
    return want if hard in (resource.RLIM_INFINITY, -1) else min(hard, want)


def test_the_command_line_raises_the_soft_limit_toward_the_hard_one() -> None:
    from inspector.system.descriptors import WANT

    code = (
        "from inspector.cli.main import main\n"
        "try:\n    main(['--version'])\nexcept SystemExit:\n    pass"
    )
    before, after, hard = _limits_after(code)
    assert before == LOW
    assert after == _expected(hard, WANT) > LOW


def test_the_library_alone_leaves_the_limit_as_it_is() -> None:
    code = "from inspector.convert.filepool import FilePool, open_cap\nprint(open_cap())"
    before, after, _ = _limits_after(code)
    assert before == after == LOW


def test_raising_asks_for_at_most_what_it_wants_and_never_lowers() -> None:
    code = (
        "from inspector.system.descriptors import raise_descriptor_limit as r\n"
        "assert r(100) == resource.getrlimit(resource.RLIMIT_NOFILE)[0]\n"
        "r(80)"  # lower than the limit now: nothing changes
    )
    before, after, hard = _limits_after(code)
    assert before == LOW and after == _expected(hard, 100)


def test_the_pool_cap_is_half_the_limit_read_now_or_a_smaller_share() -> None:
    from inspector.convert.filepool import open_cap
    from inspector.system.descriptors import UNLIMITED, descriptor_limit

    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    limit = descriptor_limit()
    assert limit == (UNLIMITED if soft == resource.RLIM_INFINITY else soft)
    assert open_cap() == max(16, limit // 2) and open_cap(4) == max(16, limit // 4)
