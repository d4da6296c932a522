"""A DeepSpeed universal checkpoint as input (`zero/<param>/fp32.pt` etc., FORMAT.md §5): found by its own
`zero` folder or `latest_universal`, before the DeepSpeed tag walk.

    scanner.py  find_universal (which folder the user means) and scan_universal
"""

from __future__ import annotations

import os

from inspector.scan.layouts.base import Found, ScanOptions
from inspector.scan.model import Checkpoint
from inspector.system.bytesource import ByteSource


class Universal:
    name = "universal"
    recognises = "a zero/ folder of per-parameter files, or latest_universal"

    def locate(self, path: str, tag: str | None, source: ByteSource) -> Found | None:
        from inspector.scan.layouts.universal.scanner import find_universal

        folder = find_universal(path, tag, False, source)
        if folder is None:
            return None
        return Found(source, os.path.dirname(folder.rstrip(os.sep)), "", folder, (), how="universal")

    def claims(self, found: Found) -> bool:
        return False  # found by `locate` alone: a tag folder the walk chose is never a universal one

    def scan(self, found: Found, options: ScanOptions) -> Checkpoint:
        from inspector.scan.layouts.universal.scanner import scan_universal

        return scan_universal(found.tag_dir, found.source)
