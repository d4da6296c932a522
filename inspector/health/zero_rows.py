"""Rows of a 2-D+ tensor (its first axis) that are zero throughout, counted over chunks that cut rows anywhere:
`exp_avg_sq`'s dead rows (an embedding row no batch touched), for the health pass's statistics
(`numerics.Accumulator`)."""

from __future__ import annotations

from typing import Any

import numpy as np

Array = np.ndarray[Any, Any]


class ZeroRows:
    """Counts rows of `row` elements that are zero throughout, over chunks that may cut rows anywhere."""

    __slots__ = ("count", "open_zero", "pos", "row")

    def __init__(self, row: int) -> None:
        self.row = row
        self.pos = 0  # elements seen
        self.open_zero = True  # the row in progress has been zero so far
        self.count = 0

    def skip(self, n: int) -> None:
        """A chunk of `n` elements without a zero: no row that touches it is zero."""
        self.pos += n
        self.open_zero = self.pos % self.row == 0  # a row cut here starts afresh

    def add(self, x: Array, mask: Array) -> None:
        np.not_equal(x, 0.0, out=mask)  # NaN counts as non-zero
        n, i, row = x.shape[0], 0, self.row
        off = self.pos % row
        if off:  # finish the row the previous chunk left open
            take = min(row - off, n)
            self.open_zero &= not bool(mask[:take].any())
            i = take
            if off + take == row:
                self.count += self.open_zero
                self.open_zero = True
        full = (n - i) // row
        if full:
            per_row = np.count_nonzero(mask[i : i + full * row].reshape(full, row), axis=1)
            self.count += int(np.count_nonzero(per_row == 0))
            i += full * row
        if i < n:  # a row this chunk starts and the next one finishes
            self.open_zero = not bool(mask[i:n].any())
        self.pos += n
