"""A DCP matrix cut in 2-D blocks (TP+FSDP) is laid as one strided record per band of rows: a tall matrix
costs records per band, not segments per row, and reads as the row-by-row segments it stands for."""

from __future__ import annotations

import pytest

from inspector.scan.layouts.dcp.placement import Chunk, TilingError, runs
from inspector.scan.model import Runs, Segment


def _grid(rows: int, cols: int, row_cuts: list[int], col_cuts: list[int]) -> list[Chunk]:
    """Chunks tiling a rows x cols float32 matrix, each its own file, data at offset 64."""
    out = []
    for r0, r1 in zip([0, *row_cuts], [*row_cuts, rows], strict=True):
        for c0, c1 in zip([0, *col_cuts], [*col_cuts, cols], strict=True):
            out.append(Chunk((r0, c0), (r1 - r0, c1 - c0), f"f{r0}_{c0}", 64))
    return out


def _row_by_row(rows: int, chunks: list[Chunk]) -> list[Segment]:
    out = []
    for r in range(rows):
        for c in sorted((c for c in chunks if c.offsets[0] <= r < c.offsets[0] + c.sizes[0]), key=lambda c: c.offsets[1]):
            w = c.sizes[1]
            out.append(Segment(c.file, c.offset + (r - c.offsets[0]) * w * 4, w, "float32"))
    return out


@pytest.mark.parametrize("rows,row_cuts", [(10_000, [5_000]), (9_999, [3_333, 6_666]), (7, [3])])
def test_blocks_are_one_record_per_band(rows: int, row_cuts: list[int]) -> None:
    chunks = _grid(rows, 6, row_cuts, [2])
    laid = runs((rows, 6), "float32", chunks)
    assert list(laid) == _row_by_row(rows, chunks)
    if rows > 1000:
        assert isinstance(laid, Runs) and len(laid.blocks) == len(row_cuts) + 1


def test_blocks_that_leave_a_gap_are_refused() -> None:
    chunks = [c for c in _grid(100, 6, [50], [2]) if c.offsets != (50, 2)]
    with pytest.raises(TilingError):
        runs((100, 6), "float32", chunks)
