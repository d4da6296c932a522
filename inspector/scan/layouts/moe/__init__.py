"""Native MoE (`deepspeed.moe.layer.MoE`): `layer_L_expert_E` files with `ep_size_E` optimizer groups under
ZeRO-1/2, and `expp_rank_E` optimizer files without ZeRO.

    scanner.py      ZeRO-1/2: the expert groups rebuilt per expert-parallel rank (a ZeroScanner)
    zero0.py        ZeRO off: unnamed per-parameter masters, named by proof
    zero0_files.py  ZeRO off: the tag folder's files by name, before any is read
    zero0_sizes.py  which expert-parallel size each MoE layer used, when one model has several
"""

from __future__ import annotations

from dataclasses import replace

from inspector.errors import UnsupportedCheckpointError
from inspector.scan.layouts.base import Found, ScanOptions, TagLayout
from inspector.scan.layouts.zero import classified, rank_files
from inspector.scan.model import Checkpoint, Parallel
from inspector.system.units import plural


def words(par: Parallel) -> str:
    """`expert parallel: EP 2 x expert-DP 2 (4 ranks)`."""
    return f"expert parallel: EP {par.ep} × expert-DP {par.dp // max(par.ep, 1) or 1} ({plural(par.dp, 'rank')})"


def described(ckpt: Checkpoint) -> Checkpoint:
    """The checkpoint with its expert-parallel words (AutoEP's too)."""
    par = ckpt.parallel
    return replace(ckpt, parallel=replace(par, words=words(par))) if par else ckpt


class MoE(TagLayout):
    name = "native MoE"
    recognises = "layer_L_expert_E / expp_rank_E expert files"

    def claims(self, found: Found) -> bool:
        from inspector.scan.layouts.moe.zero0_files import is_moe_zero0

        if is_moe_zero0(found.names):
            return True
        files = rank_files(found)
        return not isinstance(files, UnsupportedCheckpointError) and bool(files.experts)

    def scan(self, found: Found, options: ScanOptions) -> Checkpoint:
        from inspector.scan.layouts.moe.zero0 import scan_moe_zero0
        from inspector.scan.layouts.moe.zero0_files import is_moe_zero0

        if is_moe_zero0(found.names):
            return described(scan_moe_zero0(found.location, found.names))
        from inspector.scan.layouts.moe.scanner import scan_moe

        return described(scan_moe(found.location, classified(found)))
