"""PyTorch Distributed Checkpoints (FSDP1/FSDP2, HSDP, TP+FSDP, torchtitan, Accelerate, Lightning) as one layout:
`locate` finds the folder with its `.metadata`, `scan` reads the metadata (streaming, into compact arrays) and
every chunk's embedded archive directory, and builds the `Checkpoint` whose segments point at the chunks'
bytes, so convert, verify and health work on it as on any other layout."""

from __future__ import annotations

from inspector.scan.layouts.base import Found, ScanOptions
from inspector.scan.layouts.dcp.found import is_dcp, locate
from inspector.scan.model import Checkpoint
from inspector.system.bytesource import ByteSource


class DcpLayout:
    """The registry's `Layout` shape (scan/layouts/base.py) for DCP folders."""

    name = "PyTorch DCP"
    recognises = "a `.metadata` file beside `__<rank>_<n>.distcp` files"

    def locate(self, path: str, tag: str | None, source: ByteSource) -> Found | None:
        return locate(path, source, tag)

    def claims(self, found: Found) -> bool:
        return is_dcp(found.names)

    def scan(self, found: Found, options: ScanOptions) -> Checkpoint:
        from inspector.scan.layouts.dcp.build import scan_dcp

        return scan_dcp(found)


LAYOUT = DcpLayout()

__all__ = ["LAYOUT", "DcpLayout"]
