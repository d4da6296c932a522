"""AutoEP (`expert_parallel` in the config): experts fused into 3-D tensors per MoE layer, under ZeRO-3 (the
ordinary stage-3 files) or ZeRO-1/2 (per-expert files). Claimed before native MoE: under ZeRO-1/2 both
write `layer_L_expert_K` files, and only the rank-0 model states' `ds_autoep_layers` tell them apart.

    scanner.py  the expert sub-groups rebuilt per expert-data-parallel group (a ZeroScanner)
    place.py    AutoEP's affine maps applied to byte ranges
    zero12.py   the ZeRO-1/2 per-expert-files variant
"""

from __future__ import annotations

from inspector.errors import UnsupportedCheckpointError
from inspector.scan.layouts.base import Found, ScanOptions, TagLayout
from inspector.scan.layouts.moe import described
from inspector.scan.layouts.zero import classified, rank_files
from inspector.scan.model import Checkpoint
from inspector.scan.universal_needs import ExpertFiles


class AutoEP(TagLayout):
    name = "AutoEP"
    recognises = "ds_autoep_layers in the rank-0 model states"

    def claims(self, found: Found) -> bool:
        from inspector.scan.layouts.autoep.scanner import is_autoep

        files = rank_files(found)
        return not isinstance(files, UnsupportedCheckpointError) and is_autoep(found.location, files, found.trees)

    def scan(self, found: Found, options: ScanOptions) -> Checkpoint:
        from inspector.scan.layouts.autoep.scanner import scan_autoep

        return described(scan_autoep(found.location, classified(found), found.trees), ExpertFiles.FUSED)
