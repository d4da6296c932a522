"""Tensor parallel (AutoTP, Megatron-style): one ZeRO world per `mp_rank_TT`, the shards joined by what
`universal_checkpoint_info` records (or the user's `--tp-split`).

    scanner.py  every shard scanned as a data-parallel checkpoint, then joined
    join.py     each parameter's `Layout` from the records (affine map, category lists, --tp-split), compared
"""

from __future__ import annotations

from dataclasses import replace

from inspector.scan.layouts.base import Found, ScanOptions, TagLayout
from inspector.scan.model import Checkpoint, Parallel
from inspector.scan.universal_needs import UniversalNeeds, zero_off
from inspector.system.units import plural


def words(par: Parallel) -> str:
    """`tensor parallel: 2 shards x 2 data-parallel ranks`."""
    return f"tensor parallel: {plural(par.tp, 'shard')} × {plural(par.dp, 'data-parallel rank')}"


class Tensor(TagLayout):
    name = "tensor parallel"
    recognises = "mp_rank_TT files for more than one tensor-parallel rank"

    def claims(self, found: Found) -> bool:
        from inspector.scan.layouts.tensor.scanner import tp_ranks

        return len(tp_ranks(found.names)) > 1

    def scan(self, found: Found, options: ScanOptions) -> Checkpoint:
        from inspector.scan.layouts.tensor.scanner import scan_tensor

        ckpt = scan_tensor(found.location, list(found.names), options.tp_split, found.trees)
        par = ckpt.parallel
        needs = UniversalNeeds(zero_off=zero_off("tensor"))  # the keys: `Parallel.tp_recipe`
        return replace(ckpt, parallel=replace(par, words=words(par)), universal=needs) if par else ckpt
