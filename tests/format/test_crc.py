"""crc32_combine against zlib: the CRC of a concatenation from its pieces' CRCs, for any lengths."""

from __future__ import annotations

import zlib

from hypothesis import given
from hypothesis import strategies as st

from inspector.format.crc import crc32_combine


@given(st.binary(max_size=300), st.binary(max_size=300))
def test_combine_is_the_crc_of_the_concatenation(a: bytes, b: bytes) -> None:
    assert crc32_combine(zlib.crc32(a), zlib.crc32(b), len(b)) == zlib.crc32(a + b)


def test_combine_over_lengths_with_many_bits() -> None:
    """Lengths past the small ones hypothesis draws: each set bit of the length is a step of the shift."""
    a = bytes(range(256)) * 3
    for n in (1 << 16, (1 << 20) + 12345, 3 * (1 << 19)):
        b = bytes((i * 7 + 3) & 0xFF for i in range(n))
        assert crc32_combine(zlib.crc32(a), zlib.crc32(b), n) == zlib.crc32(a + b)
