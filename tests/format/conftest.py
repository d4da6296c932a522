"""Shared by the replay and item-repeat tests: each starts with empty template and memo-guard caches."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from inspector.format import memoguard, replay


@pytest.fixture
def fresh_caches() -> Iterator[None]:
    """No pickle template or passed memo check carried in from another test (the caches are per process)."""
    replay.forget()
    memoguard._PASSED.clear()
    yield
    replay.forget()
