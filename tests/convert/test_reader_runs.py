"""A tensor kept as compact `Runs` (a join of many rows) is read in chunks that are small objects walked when
read, never lists of their rows, and the bytes are those of the plain segment list it stands for."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from inspector.convert.reader import FilePool, Window, iter_chunks, read_segments_into
from inspector.scan.model import Runs, Segment, Strided
from inspector.system.source import Source


def _runs(tmp_path: Path, rows: int, widths: tuple[int, ...]) -> tuple[Runs, np.ndarray]:
    """`rows` rows joined from one file per width (a column split): row r is each file's row r in turn."""
    full = np.arange(rows * sum(widths), dtype=np.float32).reshape(rows, sum(widths))
    parts, col = [], 0
    for t, w in enumerate(widths):
        name = f"shard{t}.bin"
        (tmp_path / name).write_bytes(np.ascontiguousarray(full[:, col : col + w]).tobytes())
        parts.append((Segment(name, 0, w, "float32"), w * 4))
        col += w
    half = rows // 2  # two records, as a join of rows laid by two sets of pieces would be
    second = tuple((Segment(s.file, s.offset + half * stride, s.numel, s.dtype), stride) for s, stride in parts)
    return Runs([Strided(half, tuple(parts)), Strided(rows - half, second)]), full.reshape(-1)


def test_iter_from_is_the_tail_of_the_walk(tmp_path: Path) -> None:
    runs, _ = _runs(tmp_path, 101, (1, 3))
    every = list(runs)
    for i in (0, 1, 2, 99, 100, 101, 150, 201):
        assert list(runs.iter_from(i)) == every[i:]


@pytest.mark.parametrize("chunk", [1, 2, 3, 5, 7, 64, 399, 400, 401, 10_000])
def test_chunks_of_runs_are_the_plain_lists_chunks(tmp_path: Path, chunk: int) -> None:
    runs, _ = _runs(tmp_path, 100, (1, 3))
    lazy = list(iter_chunks(runs, chunk))
    plain = list(iter_chunks(tuple(runs), chunk))
    assert all(isinstance(w, Window) for w in lazy)
    assert [list(w) for w in lazy] == plain


def test_a_chunk_of_many_rows_reads_the_right_bytes_in_batches(tmp_path: Path) -> None:
    runs, full = _runs(tmp_path, 20_000, (1, 1))  # 40,000 one-element rows: ten batches of runs
    chunk = 15_000
    got = []
    with FilePool(Source.at(tmp_path)) as pool:
        for w in iter_chunks(runs, chunk):
            out = np.empty(w.numel, dtype=np.float32)
            assert read_segments_into(pool, w, out) == w.numel * 4
            got.append(out)
    assert np.array_equal(np.concatenate(got), full)
