"""What a conversion from a store is held to, whichever store: the bytes a conversion of the local copy writes,
and only the bytes its plan needs fetched."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any


def without_job(data: bytes) -> bytes:
    """The output with the job fingerprint blanked: it hashes the source's paths and times (for resume), so it
    differs between any two copies of a checkpoint; everything else must be identical."""
    return re.sub(rb'(\\"job\\":\\")[0-9a-f]{16}', rb"\g<1>" + b"0" * 16, data, count=1)


def assert_same_files(got: Path, want: Path) -> None:
    """The same file names in both folders, each with the same bytes but for the job fingerprint."""
    names = sorted(p.name for p in want.iterdir())
    assert names == sorted(p.name for p in got.iterdir())
    for name in names:
        assert without_job((got / name).read_bytes()) == without_job((want / name).read_bytes()), name


def assert_fetched_only_the_plan(cli: Any, local: Path, fetched: int) -> tuple[int, int]:
    """A default (bf16 out of fp32 masters) conversion fetched the bytes its plan reads plus the scan's
    metadata (a zip directory, a pickle and a few 64 KiB blocks of local headers per file), not the Adam
    moments or the module copy. Returns (the plan's bytes, the checkpoint's bytes on disk)."""
    need = json.loads(cli("preflight", local, "--json").stdout)["read_bytes"]
    files = [p for p in local.rglob("*") if p.is_file()]
    total = sum(p.stat().st_size for p in files)
    assert fetched <= 1.05 * need + len(files) * (512 << 10), (fetched, need)
    assert fetched < 0.6 * total
    return need, total
