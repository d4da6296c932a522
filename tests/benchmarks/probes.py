#!/usr/bin/env python
"""What preflight's probes read on this machine, beside rates of the work they stand in for (issue 43).

Until 2026-12-04 preflight priced every kind of CPU work in units of one 4 MiB copy; on a 16-core VM that
copy read 3.9x slower than on the 2-core reference machine (it fits this one's L3, not that one's) while
the runs there took 1.0-1.8x this machine's time, and the estimates came out +60 to +290 %. This prints, as
one JSON object, preflight's own probes (`convert.rates`: the copy, the cast, fresh pages, CRC-32, the
Python loop) and the rates of the kernels the runs spend their CPU in (copies at several sizes, zlib's
CRC-32, numpy's passes, health's own kernels, pread and pwrite through the page cache, a plain Python loop),
so that two machines' rows show which probe travels; `fit_preflight.py --rates` reads it (or the device
script's machine.txt) for rows written before preflight took a probe. Each is the best of a few tries on
one thread.

    python tests/benchmarks/probes.py > probes.json
"""

from __future__ import annotations

import json
import os
import platform
import sys
import tempfile
import time
import zlib
from collections.abc import Callable
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from inspector.convert import rates
from inspector.convert.cast import cast_raw
from inspector.health.chunk_math import rounds_to
from inspector.health.numerics import BF16, Buffers, group_sums, widen_into


def best(run: Callable[[], object]) -> float:
    """The fastest run, in seconds, as preflight's own probes take it (`rates.best`)."""
    return rates.best(run)


def copy_rate(nbytes: int) -> float:
    src, dst = np.ones(nbytes, np.uint8), np.zeros(nbytes, np.uint8)
    dst.fill(1)
    return nbytes / best(lambda: np.copyto(dst, src))


def crc_rate(nbytes: int = 1 << 20) -> float:
    data = np.random.default_rng(0).integers(0, 255, nbytes, np.uint8).tobytes()
    return nbytes / best(lambda: zlib.crc32(data))


def reduce_rate(elems: int = 1 << 20) -> float:
    """fp32 bytes/s through min, max and a sum of squares: three of health's passes over one chunk."""
    x = np.random.default_rng(0).standard_normal(elems, dtype=np.float32)
    return 4 * elems / best(lambda: rates.reduce_passes(x))


def health_kernels(elems: int = 1 << 20) -> dict[str, float]:
    """Microseconds a Mi elements through health's own kernels on one thread (`health.numerics`,
    `health.chunk_math`): the bf16 copy widened, Σv and Σv² by groups, and the rounding check of a copy
    against masters with random low bits (ties as rare as a trained model's)."""
    rng = np.random.default_rng(0)
    master = rng.standard_normal(elems, dtype=np.float32)
    module = np.empty(elems, np.uint16)
    cast_raw(master.view(np.uint8), "float32", module.view(np.uint8), "bfloat16", elems)
    buf = Buffers(elems)
    wide = np.empty(elems, np.float32)
    widen_into(module.view(BF16), buf.wide)
    spent = np.empty_like(master)

    def check() -> bool:
        np.copyto(spent, master)  # the check spends the master it is given: a fresh copy each time
        return rounds_to(spent, module, buf)

    assert check(), "the copy is not its master rounded: the probe would time the wrong path"
    us = 1e6 * elems / (1 << 20)
    copy = best(lambda: np.copyto(spent, master))
    return {
        "widen bf16": best(lambda: widen_into(module.view(BF16), wide)) * us,
        "group sums": best(lambda: group_sums(master, buf)) * us,
        "rounding check": (best(check) - copy) * us,
    }


def file_rates(nbytes: int = 64 << 20, window: int = 1 << 20) -> dict[str, float]:
    """Bytes/s one thread moves through the page cache in `window` pieces: pwrite into a new file (fresh
    page-cache pages: convert's writes) and preadv of the same file once resident (every run's reads, as the
    sweep's floor reads them), in $TMPDIR."""
    from inspector.convert.reader import buffer

    buf = memoryview(buffer(window))  # type: ignore[arg-type]
    buf[:] = b"\x01" * window
    fd, path = tempfile.mkstemp(prefix="zi-probe-")
    try:
        t = time.perf_counter()
        for off in range(0, nbytes, window):
            os.pwrite(fd, buf, off)
        wrote = nbytes / (time.perf_counter() - t)

        def read_all() -> None:
            for off in range(0, nbytes, window):
                os.preadv(fd, [buf], off)

        read_all()
        return {"pwrite new": wrote, "pread resident": nbytes / best(read_all)}
    finally:
        os.close(fd)
        os.unlink(path)


def python_rate(n: int = 100_000) -> float:
    """Loop iterations/s of plain Python (a dict store, an attribute, a tuple): what the per-file, per-read
    and per-job bookkeeping stand for."""

    def loop() -> None:
        d: dict[int, tuple[int, int]] = {}
        for i in range(n):
            d[i & 255] = (i, i.bit_length())

    return n / best(loop)


def main() -> None:
    pace = rates.Pace()  # fp32 -> bf16, CRC-32 and the Python loop as preflight samples them
    for _ in range(10):
        pace.sample()
    said = {
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, {platform.python_version()}",
        "numpy": np.__version__,
        "zlib": zlib.ZLIB_RUNTIME_VERSION,
        "preflight": {
            "copy_rate": rates.copy_rate(),
            "cast_rate": pace.cast,
            "page_rate": rates.page_rate(),
            "crc_rate": pace.crc,
            "py_rate": pace.python,
        },
        "copy": {f"{n >> 10} KiB": copy_rate(n) for n in (256 << 10, 1 << 20, 4 << 20, 64 << 20)},
        "crc32 1 MiB": crc_rate(),
        "page cache": file_rates(),
        "python loop": python_rate(),
        "min+max+squares 4 MiB fp32": reduce_rate(),
        "health us per Mi elements": health_kernels(),
    }
    print(json.dumps(said, indent=1))


if __name__ == "__main__":
    main()
