"""CRC-32 of a concatenation from its pieces' CRCs (zlib's `crc32_combine`, which Python's zlib does not
expose): a writer that already checksummed each piece of a file as it wrote it has the file's CRC without
reading the file back. GF(2) polynomial arithmetic modulo the CRC-32 polynomial, as zlib 1.2.12+ does it."""

from __future__ import annotations

from functools import lru_cache

_POLY = 0xEDB88320  # the reflected CRC-32 polynomial
_ONE = 1 << 31  # x^0 in the reflected representation


def _multmodp(a: int, b: int) -> int:
    """a(x) * b(x) modulo p(x), both reflected."""
    m, p = _ONE, 0
    while True:
        if a & m:
            p ^= b
            if a & (m - 1) == 0:
                return p
        m >>= 1
        b = (b >> 1) ^ _POLY if b & 1 else b >> 1


def _powers() -> tuple[int, ...]:
    """x^(2^k) modulo p(x) for k = 0..31."""
    out, p = [], 1 << 30  # x^1
    for _ in range(32):
        out.append(p)
        p = _multmodp(p, p)
    return tuple(out)


_X2N = _powers()


@lru_cache(maxsize=256)
def _shift(nbytes: int) -> int:
    """x^(8 * nbytes) modulo p(x): what appending `nbytes` bytes does to a CRC (cached: chunk sizes repeat)."""
    p, n, k = _ONE, nbytes, 3
    while n:
        if n & 1:
            p = _multmodp(_X2N[k & 31], p)
        n >>= 1
        k += 1
    return p


def crc32_combine(crc1: int, crc2: int, len2: int) -> int:
    """The CRC-32 of A + B from crc32(A), crc32(B) and len(B)."""
    return _multmodp(_shift(len2), crc1) ^ crc2
