"""CRC-32 of a file in OUT, the one checksum the executor journals and a bucket's objects carry."""

from __future__ import annotations

import os
import queue
import threading
import zlib


def fd_crc32(fd: int) -> int:
    """CRC-32 of an open file from its start, read into one of a few shared blocks: however many writers
    checksum at once, the blocks are the same few (a fresh 8 MiB block per call, from 16 writer threads,
    kept 70 MiB more resident than from 2)."""
    buf = _crc_block()
    try:
        view, crc, offset = memoryview(buf), 0, 0
        while n := os.preadv(fd, [view], offset):
            crc = zlib.crc32(view[:n], crc)
            offset += n
        return crc
    finally:
        _CRC_BLOCKS.put(buf)


_CRC_BLOCKS: queue.Queue[bytearray] = queue.Queue()
_CRC_MADE = [0]
_CRC_LOCK = threading.Lock()
CRC_AT_ONCE = 4  # checksums in flight at once: zlib's crc32 runs at GB/s and releases the GIL


def _crc_block() -> bytearray:
    """A free block (made on demand, at most CRC_AT_ONCE of them), else the next one returned."""
    with _CRC_LOCK:
        if _CRC_BLOCKS.empty() and _CRC_MADE[0] < CRC_AT_ONCE:
            _CRC_MADE[0] += 1
            return bytearray(1 << 20)
    return _CRC_BLOCKS.get()
