"""Pipeline parallel with native MoE (Megatron-DeepSpeed style; FORMAT.md, "Pipeline + native MoE"): the MoE save path replaces the
pipeline one, so there are no `layer_XX` files; each stage writes `mp_rank_SS_model_states.pt` (its non-expert
`module`, `param_shapes` and `num_experts`), its optimizer files per data-parallel rank, and
`layer_L_expert_E_mp_rank_SS` with L counted from 0 on every stage and E global.

    scanner.py  every stage scanned as a native-MoE world of its own, then the stages laid side by side

Asked before the tensor layout, which would otherwise take the `mp_rank_SS` files for tensor-parallel shards.
"""

from __future__ import annotations

from inspector.scan.layouts.base import Found, ScanOptions, TagLayout
from inspector.scan.model import Checkpoint


class PipelineMoE(TagLayout):
    name = "pipeline + native MoE"
    recognises = "mp_rank_SS stage files beside layer_L_expert_E_mp_rank_SS expert files"

    def claims(self, found: Found) -> bool:
        from inspector.scan.layouts.pipemoe.scanner import is_pipeline_moe

        return is_pipeline_moe(found.location, found.names, found.trees)

    def scan(self, found: Found, options: ScanOptions) -> Checkpoint:
        from inspector.scan.layouts.pipemoe.scanner import scan_pipeline_moe

        return scan_pipeline_moe(found.location, found.names, found.trees)
