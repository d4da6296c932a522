"""Size and count units shared by the CLI, the app and `scan --json` (inspector.system.units)."""

from __future__ import annotations

import pytest

from inspector.system.units import format_bytes, parse_count, parse_size

GiB = 2**30
MiB = 2**20
KiB = 2**10


# --------------------------------------------------------------------------------------------------------------
# sizes
# --------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("5GB", 5 * 10**9),
        ("5gb", 5 * 10**9 // 8),  # HF: lowercase final b on a decimal unit means bits
        ("5Gb", 5 * 10**9 // 8),
        ("5GiB", 5 * GiB),
        ("5gib", 5 * GiB),
        ("500MB", 500 * 10**6),
        ("500MiB", 500 * MiB),
        ("10KB", 10_000),
        ("10KiB", 10 * KiB),
        ("2TB", 2 * 10**12),
        ("1.5G", 3 * GiB // 2),
        ("1.5g", 3 * GiB // 2),
        ("2M", 2 * MiB),
        ("3K", 3 * KiB),
        ("1T", 2**40),
        ("4.35GB", 4_350_000_000),  # exact, no float rounding down
        ("0.5GiB", GiB // 2),
        (" 7 GB ", 7 * 10**9),
        ("123", 123),
        ("123B", 123),
        ("0", 0),
        (".5K", 512),
    ],
)
def test_parse_size(text: str, expected: int) -> None:
    assert parse_size(text) == expected


@pytest.mark.parametrize(
    "text",
    ["", "  ", "GB", "5XB", "5 G B", "-5GB", "1e9", "5GBs", "1.5", "1.5B", "12b", "five", "5..0G", "5iB"],
)
def test_parse_size_rejects(text: str) -> None:
    with pytest.raises(ValueError, match="invalid size"):
        parse_size(text)


def test_parse_size_int_and_types() -> None:
    assert parse_size(42) == 42
    with pytest.raises(ValueError, match="negative"):
        parse_size(-1)
    with pytest.raises(TypeError):
        parse_size(True)
    with pytest.raises(TypeError):
        parse_size(1.5)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("n", "expected"),
    [
        (0, "0 B"),
        (1023, "1023 B"),
        (1024, "1.0 KiB"),
        (1536 * MiB, "1.5 GiB"),
        (3 * GiB // 2, "1.5 GiB"),
        (GiB - 1, "1.0 GiB"),
        (-2 * MiB, "-2.0 MiB"),
        (5 * 2**40, "5.0 TiB"),
        (2**70, "1024.0 EiB"),
    ],
)
def test_format_bytes(n: int, expected: str) -> None:
    assert format_bytes(n) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [("7B", 7 * 10**9), ("1.5b", 1_500_000_000), ("500M", 500_000_000), ("1G", 10**9), ("200K", 200_000),
     ("12345", 12345), ("0.5T", 5 * 10**11)],
)
def test_parse_count_is_decimal_with_b_for_billion(text: str, expected: int) -> None:
    assert parse_count(text) == expected


@pytest.mark.parametrize("text", ["", "1.5", "1MB", "1GiB", "-3M", "x", "1.0000000001K"])
def test_parse_count_rejects(text: str) -> None:
    with pytest.raises(ValueError, match="invalid count"):
        parse_count(text)
