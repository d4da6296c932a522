"""The zip64 extra field of a central-directory record: where a member's sizes and offset live when they do
not fit in 32 bits (a torch.save of more than 4 GiB)."""

from __future__ import annotations

import struct
from collections.abc import Callable

_EXTRA_HEAD = struct.Struct("<HH")  # an extra field's id and length


def zip64_extra(
    cd: bytes, at: int, xlen: int, sizes: tuple[int, int, int], damaged: Callable[[str], Exception]
) -> tuple[int, int, int]:
    """(usize, csize, offset): `sizes` with each that is 0xFFFFFFFF taken, in order, from the zip64 extra
    field (id 1) of the `xlen` bytes of extras at `at` in `cd`; `damaged(why)` is raised when it is missing or
    cut short."""
    need = [v == 0xFFFFFFFF for v in sizes]
    want = 8 * sum(need)
    p, end = at, at + xlen
    while p + 4 <= end:
        hid, hlen = _EXTRA_HEAD.unpack_from(cd, p)
        if hid == 1:
            if hlen < want or p + 4 + want > end:
                raise damaged("a zip64 extra field is cut short")
            vals = iter(struct.unpack_from(f"<{sum(need)}Q", cd, p + 4))
            usize, csize, hoff = (next(vals) if n else v for n, v in zip(need, sizes, strict=True))
            return usize, csize, hoff
        p += 4 + hlen
    raise damaged("an entry needs a zip64 extra field but has none")
