"""The file descriptors this process may hold: the limit the readers' pools are sized by, and raising it.

A ZeRO-3 save of 4,096 ranks is 8,192 files, and a conversion or health pass reads a window of every rank's
file per stripe. A pool of open files smaller than the rank count reopens files at every stripe: measured on
a 20M, 8,192-rank demo with a pool of 5,000 (a soft limit of 20,000), 147 K `openat` and as many `close`
against 21 K, 7.7 s against 2.0 s at 4,096 ranks. The soft `RLIMIT_NOFILE` is often 1,024 while the hard
one is 524,288 or more (systemd's default, Docker's): the command line raises the soft limit toward the hard
one once at start, as servers and launchers do (`raise_descriptor_limit`). The library never changes it by
itself: a program that imports it keeps its own limits.
"""

from __future__ import annotations

try:  # pragma: no cover - resource is missing only on Windows
    import resource
except ImportError:  # pragma: no cover
    resource = None  # type: ignore[assignment]

WANT = 1 << 17  # the soft limit the command line asks for, at most: a pool of half of it (65,536 files)
# holds a 32,768-rank save's optimizer files open at once
UNLIMITED = 1 << 13  # what a soft limit of RLIM_INFINITY counts as: pools of 4,096 files


def descriptor_limit() -> int | None:
    """The soft `RLIMIT_NOFILE` now (UNLIMITED for an unlimited one), or None where it cannot be read."""
    if resource is None:
        return None
    try:
        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    except (OSError, ValueError):
        return None
    if soft == resource.RLIM_INFINITY or soft < 0:
        return UNLIMITED
    return int(soft)


def raise_descriptor_limit(want: int = WANT) -> int | None:
    """Raise the soft `RLIMIT_NOFILE` to min(hard, `want`) if it is lower; the soft limit after. Never
    lowers it; a refusal (macOS above OPEN_MAX, a sandbox's policy) leaves it as it was."""
    if resource is None:
        return None
    try:
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        target = want if hard == resource.RLIM_INFINITY or hard < 0 else min(hard, want)
        if soft != resource.RLIM_INFINITY and 0 <= soft < target:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    except (OSError, ValueError):
        pass
    return descriptor_limit()
