"""AutoEP under ZeRO-1/2 (DeepSpeed 0.19.8, `checkpoint_format: per_expert_files`).

The tag folder holds rank 0's `mp_rank_00_model_states.pt` (the dense 16-bit weights and `ds_autoep_layers`),
one `layer_L_expert_K_mp_rank_00_model_states.pt` per GLOBAL expert K (its 16-bit slices, named
`<prefix>.w1.K` etc., 2-D), and one optimizer file per rank with two groups: the dense one partitioned over
every rank, and `ep_size_E` (`moe: True`) partitioned over each expert-data-parallel group alone
(`partition_count` [ws, ws/E]) with the LOCAL fused shapes `[n_local, ...]` in `param_shapes`. No file says
which ranks form an expert-data-parallel group: DeepSpeed's rule (`groups._create_expert_and_data_parallel`)
makes rank R expert-parallel rank R mod E, as for native MoE (scan/moe.py); the one rank that records its
`ep_rank` (rank 0, in the model states) is checked against it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import replace

from inspector.errors import UnsupportedCheckpointError
from inspector.format.torchzip import TensorRef
from inspector.parse.autoep import AutoEPLayer
from inspector.parse.states import OptimStates
from inspector.scan.files import RankFiles, expert_copies
from inspector.scan.layout import Layout, ParamShapes, stage12_layout
from inspector.scan.layouts.autoep.place import holding, place
from inspector.scan.model import Finding, GroupInfo, Parallel, RankGroup, Segment, Severity
from inspector.system.bytesource import ByteSource

_EP_NAME = re.compile(r"^ep_size_(\d+)$")


def zero12_layout(
    param_shapes: ParamShapes,
    states: Sequence[OptimStates],
    layers: Sequence[AutoEPLayer],
    files: RankFiles,
    source: ByteSource,
) -> tuple[Layout, Parallel]:
    """Dense groups over every rank, expert groups per expert-data-parallel group, experts placed whole."""
    ws = len(states)
    _check_rank0(layers)
    lay = Layout()
    groups: list[GroupInfo] = []
    rank_groups: list[list[RankGroup]] = [[] for _ in range(ws)]
    maps = {p.name: p for layer in layers for p in layer.params}
    copies = expert_copies(files, source, lay.findings)
    ep_max = 1
    for g, shapes in enumerate(param_shapes):
        ep = _ep_size(states, g, ws)
        ep_max = max(ep, ep_max)
        first = len(groups)
        local = {}
        for e in range(ep):
            dp = list(range(e, ws, ep))
            part = stage12_layout((shapes,), [replace(states[r], groups=(states[r].groups[g],)) for r in dp])
            lay.findings += [replace(f, message=f"Group {g}: {f.message}") for f in part.findings]
            if part.master_dtype != "float32":
                lay.master_dtype = part.master_dtype
            groups += [replace(gi, index=len(groups)) for gi in part.groups]
            for d, r in enumerate(dp):
                rank_groups[r] += [replace(rg, group=len(groups) - 1) for rg in part.rank_groups[d]]
            local[e] = part
        if ep == 1:
            lay.params.update({n: replace(t, group=first) for n, t in local[0].params.items()})
            continue
        for name, _ in shapes:
            if name not in maps:
                raise UnsupportedCheckpointError(
                    f"Expert parameter {name} has no affine map in ds_autoep_layers.",
                    hint="The model-states file is damaged or comes from another run.",
                )
            t = place(maps[name], {e: local[e].params[name] for e in range(ep)}, first)
            lay.params[name] = replace(t, module_copy=_module_copy(name, t.numel, copies))
    lay.groups = tuple(groups)
    lay.rank_groups = [tuple(rg) for rg in rank_groups]
    lay.findings += _missing(layers, files)
    rows = tuple(
        holding(layer.expert_prefix, layer.placement, {e: range(e, ws, layer.ep_size) for e in layer.placement})
        for layer in layers
    )
    return lay, Parallel("expert", ep=ep_max, dp=ws, placement=rows, autoep=True)


def _check_rank0(layers: Sequence[AutoEPLayer]) -> None:
    """Rank 0 is expert-parallel rank 0 and expert-data-parallel rank 0 under DeepSpeed's rule; say so if its
    own record disagrees rather than place experts by a rule the run did not follow."""
    for layer in layers:
        if layer.ep_rank not in (None, 0) or layer.edp_rank not in (None, 0):
            raise UnsupportedCheckpointError(
                f"Rank 0 records expert-parallel rank {layer.ep_rank} and expert-data-parallel rank "
                f"{layer.edp_rank} for {layer.module_path}; DeepSpeed's rank rule gives 0 and 0.",
                hint="The model-states file is damaged or was not written by DeepSpeed's AutoEP.",
            )


def _ep_size(states: Sequence[OptimStates], g: int, ws: int) -> int:
    """Group g's expert-parallel size: E for `ep_size_E` groups (every rank agreeing), 1 for dense ones."""
    names = {str(st.groups[g].hyperparams.get("name", "")) for st in states}
    moe = {st.groups[g].hyperparams.get("moe") is True for st in states}
    if len(names) != 1 or len(moe) != 1:
        raise UnsupportedCheckpointError(
            f"The optimizer files list different parameter groups at position {g} (by name).",
            hint="Files from different runs are mixed; restore the tag folder from one save.",
        )
    m = _EP_NAME.match(names.pop())
    if not moe.pop() and m is None:
        return 1
    if m is None or int(m.group(1)) < 1 or ws % int(m.group(1)):
        raise UnsupportedCheckpointError(
            f"Expert group {g} is not named ep_size_<E> with E dividing the {ws} optimizer files.",
            hint="Rank files are missing, or the optimizer file is damaged.",
        )
    return int(m.group(1))



def _module_copy(name: str, numel: int, copies: Mapping[str, TensorRef]) -> tuple[Segment, ...]:
    """The logical tensor's 16-bit copy: expert K's slice `<name>.K` is its K-th block along the first
    dimension (AutoEP's fused experts); none unless every expert's slice is there and the sizes add up."""
    segs: list[Segment] = []
    k = 0
    while (ref := copies.get(f"{name}.{k}")) is not None:
        segs += [Segment(ref.path, o, n, ref.dtype) for o, n in ref.runs()]
        k += 1
    if sum(s.numel for s in segs) != numel or len({s.dtype for s in segs}) != 1:
        return ()
    return tuple(segs)


def _missing(layers: Sequence[AutoEPLayer], files: RankFiles) -> list[Finding]:
    """One finding per missing per-expert file (the 16-bit experts; the fp32 masters are in the optimizer)."""
    out = []
    for layer in layers:
        i = layer.layer_id
        gone = [k for k in range(min(layer.num_experts, files.present)) if (i, k) not in files.experts]
        if gone:
            out.append(
                Finding(
                    Severity.ERROR,
                    "missing-expert",
                    f"The per-expert 16-bit file of expert{'s' if len(gone) > 1 else ''} {', '.join(map(str, gone[:8]))} "
                    f"of AutoEP layer {layer.module_path} (layer_{i}_expert_K_mp_rank_00_model_states.pt) "
                    "are missing.",
                    None,
                    "Copy the complete checkpoint folder; each expert's 16-bit weights are in its own file.",
                )
            )
    return out


__all__ = ["zero12_layout"]
