"""DeepSpeed's own converters beside ours on every committed layout fixture, where they write something: each
outcome tests/interop/ds_tools.py recorded in tests/fixtures/layouts/ds_tools.txt (README's layouts table) is
what a fresh run of the tool gives now, and where it is `exact`, every parameter DeepSpeed writes equals our
fp32 output bit for bit. Where a tool fails, the record says with what (rerun the script to refresh it)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.interop.ds_tools import RECORD, TOOLS, fixtures, outcome

pytestmark = pytest.mark.interop


def _recorded() -> dict[tuple[str, str], str]:
    out = {}
    for line in RECORD.read_text().splitlines():
        parts = line.split(" | ", 2)
        if len(parts) == 3:
            out[(parts[0], parts[1])] = parts[2]
    return out


RECORDED = _recorded()
WRITTEN = sorted(k for k, v in RECORDED.items() if not v.startswith("fails"))


def test_every_fixture_and_tool_has_a_recorded_outcome() -> None:
    assert set(RECORDED) == {(n, t) for n in fixtures() for t in TOOLS}


@pytest.mark.parametrize(("name", "tool"), WRITTEN, ids=[f"{n}-{t}" for n, t in WRITTEN])
def test_where_deepspeeds_tool_writes_it_agrees_with_us_as_recorded(
    name: str, tool: str, tmp_path: Path
) -> None:
    assert outcome(tool, name, tmp_path) == RECORDED[(name, tool)]
