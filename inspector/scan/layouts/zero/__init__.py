"""Data-parallel ZeRO (stages 0-3, offload, hpZ, BF16_Optimizer): the base layout the others extend.

    scanner.py  ZeroScanner: one data-parallel world's rank files into a `Checkpoint` (the MoE, AutoEP and
                tensor-parallel scans subclass or reuse it)
    zero0.py    ZeRO off (stage 0): the unnamed masters in `mp_rank_00`'s optimizer state, named by proof

It claims a tag folder whose rank files `scan/files.classify` sorts into one data-parallel world (model
states and optimizer files of model-parallel rank 0); `rank_files` keeps that sorting in `Found.memo`, so
the layouts asked before it (AutoEP, native MoE) and its own scan classify the folder once.
"""

from __future__ import annotations

from inspector.errors import UnsupportedCheckpointError
from inspector.scan.files import RankFiles, classify
from inspector.scan.layouts.base import Found, ScanOptions, TagLayout
from inspector.scan.model import Checkpoint

_MEMO = "zero.rank_files"


def rank_files(found: Found) -> RankFiles | UnsupportedCheckpointError:
    """The tag folder's rank files as one data-parallel world (expert files kept), or why they are not one;
    sorted once per scan."""
    if _MEMO not in found.memo:
        try:
            found.memo[_MEMO] = classify(found.tag_dir, found.source, experts_ok=True)
        except UnsupportedCheckpointError as exc:
            found.memo[_MEMO] = exc
    out: RankFiles | UnsupportedCheckpointError = found.memo[_MEMO]
    return out


def classified(found: Found) -> RankFiles:
    """`rank_files`, raising its refusal (what the folder holds that no layout reads yet)."""
    files = rank_files(found)
    if isinstance(files, UnsupportedCheckpointError):
        raise files
    return files


class Zero(TagLayout):
    name = "ZeRO data parallel"
    recognises = "zero_pp_rank_R_mp_rank_00 optimizer files and mp_rank_00 model states"

    def claims(self, found: Found) -> bool:
        files = rank_files(found)
        if isinstance(files, UnsupportedCheckpointError):
            return False
        return bool(files.optim or files.zero3_model or files.model)

    def scan(self, found: Found, options: ScanOptions) -> Checkpoint:
        from inspector.scan.layouts.zero.scanner import ZeroScanner
        from inspector.scan.layouts.zero.zero0 import is_zero0, scan_zero0

        files, loc = classified(found), found.location
        if is_zero0(files) and (ckpt := scan_zero0(loc, files, trees=found.trees)) is not None:
            return ckpt  # ZeRO off: the masters in the one model-states file
        return ZeroScanner(loc, files, found.trees).build()
