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
from inspector.scan.universal_needs import ExpertFiles, UniversalNeeds, zero_off
from inspector.system.units import plural


def words(par: Parallel) -> str:
    """`expert parallel: EP 2 x expert-DP 2 (4 ranks)`."""
    return f"expert parallel: EP {par.ep} × expert-DP {par.dp // max(par.ep, 1) or 1} ({plural(par.dp, 'rank')})"


# seen with the native-MoE fixtures' model, bf16 and fp16 (tests/interop/test_universal_layouts_interop.py)
ZERO_OFF_WORDS = (
    "ZeRO off (FP16_UnfusedOptimizer at stage 0, in bf16 as in fp16): DeepSpeed 0.19.8 never reads a universal "
    "checkpoint's zero/ folder at stage 0 with MoE (engine.load_checkpoint opens each expert-parallel rank's "
    "ZeRO-off optimizer file, expp_rank_R_mp_rank_00_optim_states.pt, in the universal folder and fails with "
    "FileNotFoundError), so it cannot resume one"
)


def described(ckpt: Checkpoint, experts: ExpertFiles = ExpertFiles.LOCAL_SLOTS) -> Checkpoint:
    """The checkpoint with its expert-parallel words and what a universal checkpoint of it needs (AutoEP's too:
    its `experts` are fused)."""
    par = ckpt.parallel
    needs = UniversalNeeds(experts, zero_off("expert", ZERO_OFF_WORDS))
    return replace(ckpt, parallel=replace(par, words=words(par)), universal=needs) if par else ckpt


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
            return described(scan_moe_zero0(found.location, found.names, found.trees))
        from inspector.scan.layouts.moe.scanner import scan_moe

        return described(scan_moe(found.location, classified(found), found.trees))
