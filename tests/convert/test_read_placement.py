"""Reads land on a page: the kernel's copy from the page cache slows 2.5-6.5x when the buffer lies 4-16
bytes past the source within a page (results.md), and numpy starts large buffers 16 bytes into one, so a
record torch saved on a page boundary read slowly. Every buffer a read fills starts on a page."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from inspector.convert import pipeline
from inspector.convert.options import ConvertOptions
from inspector.convert.plan import build_plan
from inspector.convert.reader import PAGE, FilePool, buffer, empty, read_bits, read_segments
from inspector.demo.writer import DemoSpec
from inspector.health.chunk_math import Scratch
from inspector.scan.model import Segment
from inspector.scan.scanner import scan
from inspector.system.source import Source
from tests.conftest import DemoCache


def _on_page(a: np.ndarray) -> bool:
    return a.ctypes.data % PAGE == 0


@pytest.mark.parametrize("nbytes", [0, 1, 16, 4095, 4096, 1 << 20, (1 << 20) + 16])
def test_a_buffer_starts_on_a_page_and_is_its_size(nbytes: int) -> None:
    b = buffer(nbytes)
    assert (nbytes == 0 or _on_page(b)) and b.shape == (nbytes,) and b.dtype == np.uint8 and b.flags.writeable
    b[:] = 7  # all of it is ours
    assert int(b.sum()) == 7 * nbytes


@pytest.mark.parametrize("dtype", [np.float32, np.uint16, np.float64])
def test_empty_is_a_typed_buffer(dtype: type) -> None:
    a = empty(1 << 18, dtype)
    assert _on_page(a) and a.shape == (1 << 18,) and a.dtype == np.dtype(dtype)


def test_whole_tensor_reads_land_on_a_page(tmp_path: Path) -> None:
    values = np.arange(1 << 16, dtype=np.float32)
    (tmp_path / "t.bin").write_bytes(b"\0" * PAGE + values.tobytes())  # the record starts on a page
    seg = Segment("t.bin", PAGE, values.shape[0], "float32")
    with FilePool(Source.at(tmp_path)) as pool:
        for got in (read_segments(pool, [seg], "float32"), read_bits(pool, [seg], "float32")):
            assert _on_page(got) and np.array_equal(got, values)


def test_health_and_convert_read_into_page_buffers(demo: DemoCache) -> None:
    assert all(_on_page(r) for r in Scratch(1 << 18).raw)
    plan = build_plan(scan(str(demo(DemoSpec(stage=2)))), ConvertOptions(dtype="bf16"))
    src, out = pipeline.make_pools(plan)
    assert src.qsize() and out.qsize()
    while not src.empty():
        assert _on_page(src.get())
    while not out.empty():
        assert _on_page(out.get())
