"""How much of a file is in the page cache, read without reading it: `mincore(2)` over a read-only mapping.

Python has no mincore and `posix_fadvise` cannot ask, so the file is mapped (PROT_READ, a window at a time,
never touched: no page is read and RSS does not grow) and the kernel's residency vector fetched through
ctypes. Linux only; None elsewhere or when the mapping is refused (an `ulimit -v` too tight for a window).
"""

from __future__ import annotations

import ctypes
import mmap
import os
import sys

SAMPLES = 64  # windows looked at per file
SAMPLE = 1 << 20  # bytes per window (256 pages)

_PAGE = mmap.PAGESIZE
_BIT0 = bytes(i & 1 for i in range(256))  # a residency byte's meaning: only bit 0 is defined
_libc: ctypes.CDLL | None = None


def _lib() -> ctypes.CDLL | None:
    global _libc
    if _libc is None and sys.platform.startswith("linux"):
        lib = ctypes.CDLL(None, use_errno=True)
        lib.mmap.restype = ctypes.c_void_p
        lib.mmap.argtypes = [
            ctypes.c_void_p,
            ctypes.c_size_t,
            ctypes.c_int,
            ctypes.c_int,
            ctypes.c_int,
            ctypes.c_long,
        ]
        lib.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
        lib.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
        _libc = lib
    return _libc


def _vector(lib: ctypes.CDLL, fd: int, pos: int, span: int) -> bytes | None:
    """The residency bytes of `span` bytes of `fd` from `pos` (page aligned), or None."""
    addr = lib.mmap(None, span, mmap.PROT_READ, mmap.MAP_SHARED, fd, pos)
    if addr in (None, ctypes.c_void_p(-1).value):
        return None
    try:
        vec = (ctypes.c_ubyte * -(-span // _PAGE))()
        return bytes(vec).translate(_BIT0) if lib.mincore(addr, span, vec) == 0 else None
    finally:
        lib.munmap(addr, span)


def sample_windows(
    fd: int, samples: int = SAMPLES, sample: int = SAMPLE
) -> list[tuple[int, int, float]] | None:
    """(offset, length, resident fraction) of `samples` windows of `sample` bytes spread evenly over the file
    (windows of the whole file when it is smaller): a few hundred microseconds whatever its size. None when
    it cannot be told."""
    lib = _lib()
    if lib is None:
        return None
    size = os.fstat(fd).st_size
    if size <= samples * sample:
        starts, span = range(0, size, sample), sample
    else:
        step = size // samples
        starts, span = range(0, samples * step, step), sample
    out = []
    for pos in starts:
        pos -= pos % _PAGE
        length = min(span, size - pos)
        vec = _vector(lib, fd, pos, length)
        if vec is None:
            return None
        out.append((pos, length, vec.count(1) / len(vec) if vec else 1.0))
    return out


def resident_share(windows: list[tuple[int, int, float]]) -> float:
    """The fraction of the bytes `sample_windows` looked at that are in the page cache (1.0 for none)."""
    total = sum(n for _, n, _ in windows)
    return sum(n * f for _, n, f in windows) / total if total else 1.0


def resident_fraction(fd: int, samples: int = SAMPLES) -> float | None:
    """The fraction of `fd`'s pages in the page cache, from `samples` windows (None when it cannot be told)."""
    windows = sample_windows(fd, samples)
    return None if windows is None else resident_share(windows)
