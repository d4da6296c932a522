"""Plain data-parallel runs that earlier rounds refused or called damaged (real DeepSpeed 0.19.8 runs made by
tests/fixtures/layouts/make_plain.py; each fixture's versions.txt says how): legacy (non-zip) serialization
and Ulysses sequence parallel. Each scans without a false finding in the right words, converts bit for bit
to the live engines' fp32 masters and their 16-bit cast, and verifies (`assert_exact` runs verify)."""

from __future__ import annotations

from pathlib import Path

import pytest

from inspector.scan.model import Severity
from tests.scan.layout_cases import FIXTURES, assert_exact, ckpt_dir, scan_layout

LEGACY = "dp_z2_bf16_legacy"
ULYSSES = sorted(p.name for p in FIXTURES.glob("sp2_z*_bf16"))
PLAIN = [LEGACY, *ULYSSES]


def test_the_legacy_fixture_is_legacy() -> None:
    """Every rank file starts with a pickle, not a zip header: the container under test really is legacy."""
    files = list((ckpt_dir(LEGACY) / "global_step3").glob("*.pt"))
    assert len(files) == 3 and all(f.read_bytes()[:2] == b"\x80\x02" for f in files)


@pytest.mark.parametrize("name", PLAIN)
def test_scans_without_a_false_finding(name: str) -> None:
    ckpt = scan_layout(name)
    assert not [f for f in ckpt.findings if f.severity is not Severity.INFO], ckpt.findings
    assert ckpt.world_size == 2 and ckpt.parallel is None


@pytest.mark.parametrize("name", ULYSSES)
def test_ulysses_is_named_in_the_scan(name: str) -> None:
    """The SP size the model states record as tp_degree is shown as sequence parallelism, not as TP."""
    ckpt = scan_layout(name)
    said = [f.message for f in ckpt.findings if f.code == "sequence-parallel"]
    assert len(said) == 1 and "sequence parallel" in said[0] and "2" in said[0], ckpt.findings


@pytest.mark.parametrize("name", PLAIN)
def test_converts_bit_exact(name: str, tmp_path: Path) -> None:
    assert_exact(scan_layout(name), name, tmp_path)
