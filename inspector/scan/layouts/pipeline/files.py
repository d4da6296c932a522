"""The files of a pipeline-parallel tag folder (FORMAT.md §1.2), sorted for one tensor-parallel rank.

DeepSpeed names a pipeline's files by its topology's coordinates, data parallelism left out:
`layer_XX-model_states.pt` per layer, or `layer_XX-model_TT-model_states.pt` when the topology has a `model`
axis (GPT-NeoX, Megatron-DeepSpeed; TT the tensor-parallel rank, `model_00` with one); per stage and tensor-
parallel rank one `mp_rank_MM_model_states.pt` and one optimizer file per data-parallel rank, MM = stage x
tp + TT. Rank and stage numbers come from file names, so they are bounded by the files present.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from inspector.errors import NotACheckpointError
from inspector.parse.dsconfig import DsConfig
from inspector.parse.states import ModelStates, OptimStates
from inspector.scan.claims import (
    LAYER_FILE_RE,
    LAYER_TP_RE,
    Claims,
    claim,
    layer_role,
    model_role,
    optim_role,
)
from inspector.scan.layout import Layout
from inspector.scan.layouts.pipeline.names import LAYER_NAME
from inspector.scan.locate import MODEL_RE, OPTIM_RE, Location
from inspector.scan.model import Finding, Severity

STAGE_RE = MODEL_RE


def is_pipeline(names: list[str]) -> bool:
    return any(LAYER_FILE_RE.match(n) or LAYER_TP_RE.match(n) for n in names)


def tp_layer_ranks(names: list[str]) -> set[int]:
    """The tensor-parallel ranks the layer files name (`layer_XX-model_TT-…`); empty without a model axis."""
    return {int(m.group(2)) for n in names if (m := LAYER_TP_RE.match(n))}


def claim_files(
    loc: Location, names: list[str], tp: int, pp: int | None, dp: int | None, config: DsConfig
) -> Claims:
    """Every file of a pipeline tag folder claimed (scan/claims.py): layer files of the run's one naming and
    tensor-parallel ranks, one `mp_rank_MM` per stage and tensor-parallel rank, optimizer files per stage and
    data-parallel rank (none with ZeRO off in fp16). The layer files' naming is the model axis's when the run
    is tensor-parallel, else the one most layer files use: a re-save with another topology leaves files of the
    other."""
    tp_named = sum(bool(LAYER_TP_RE.match(n)) for n in names)
    plain = sum(bool(LAYER_FILE_RE.match(n)) for n in names)
    named = tp_named > 0 and (tp > 1 or tp_named >= plain)
    mp = pp * tp if pp is not None else None
    roles = [layer_role(tp, named), model_role(mp)]
    words = "layer_XX-model_TT-model_states.pt" if named else "layer_XX-model_states.pt"
    if _masters_in_stage_files(config):
        words += "; ZeRO off in fp16, so its fp32 masters are in the stage files"
    else:
        roles.append(optim_role(dp, mp))
    return claim(loc.tag_dir, names, roles, f"this pipeline (whose layer files are named {words})")


def _masters_in_stage_files(config: DsConfig) -> bool:
    """ZeRO off in fp16 (`zero_optimization.stage` 0, fp16 on, bf16 off), as the run's config records it:
    DeepSpeed's FP16 optimizer keeps the masters in the stage files and writes no optimizer files (the bf16
    optimizer, ZeRO off too, writes them). A config that says less: optimizer files are expected."""
    return config.zero_stage == 0 and config.fp16 and not config.bf16


@dataclass
class Stage:
    """One stage's records (of one tensor-parallel rank) and the tensors rebuilt from them."""

    index: int
    model_file: str
    model: ModelStates | None = None
    optims: dict[int, str] = field(default_factory=dict)
    states: list[OptimStates] = field(default_factory=list)
    layout: Layout | None = None
    optimizer: str = "DeepSpeedZeroOptimizer"
    zero_stage: int = 1
    loss_scale: float | None = None  # ZeRO off in fp16: the stage file's optimizer record says it

    def held(self) -> dict[int, str | None]:
        """Data-parallel rank -> its optimizer file; ZeRO off in fp16 keeps the masters in the stage file."""
        return dict(self.optims) or ({0: None} if self.layout and self.zero_stage == 0 else {})


@dataclass
class PipelineFiles:
    layers: dict[int, str]  # global layer index -> its file (this tensor-parallel rank's)
    stages: dict[int, Stage]
    present: int
    findings: list[Finding]
    tp_named: bool = False  # the layer files carry a model axis (layer_XX-model_TT-…)


def classify(
    loc: Location, tp_rank: int = 0, tp: int = 1, only: frozenset[str] | None = None
) -> PipelineFiles:
    """Tensor-parallel rank `tp_rank`'s layer, stage and optimizer files (of `tp` ranks in all); `only`: the
    names the claim pass gave this pipeline (scan/claims.py), None: every name."""
    names = loc.source.listdir(loc.tag_dir)
    present = len(names)
    out = PipelineFiles({}, {}, present, [])
    optims: dict[tuple[int, int], str] = {}
    for n in names if only is None else [n for n in names if n in only]:
        path = os.path.join(loc.tag_dir, n)
        if (m := LAYER_FILE_RE.match(n)) or ((m := LAYER_TP_RE.match(n)) and int(m.group(2)) == tp_rank):
            out.layers[int(m.group(1))] = path
            out.tp_named = out.tp_named or LAYER_TP_RE.match(n) is not None
        elif (m := STAGE_RE.match(n)) and int(m.group(1)) % tp == tp_rank:
            s = int(m.group(1)) // tp
            out.stages[s] = Stage(s, path)
        elif (m := OPTIM_RE.match(n)) and int(m.group(3)) % tp == tp_rank:
            optims[(int(m.group(3)) // tp, int(m.group(2)))] = path
    high = [s for s in out.stages if s * tp >= present] + [
        r for s, d in optims for r in (s * tp, d) if r >= present
    ]
    if high:
        raise NotACheckpointError(
            f"{loc.tag_dir} holds a stage or rank file numbered {max(high):,} but only {present} files in all: "
            "a stray or crafted file, since every stage and rank of a run writes its own file.",
            hint="Remove the stray file (or restore the missing files) and try again.",
            title="Impossible rank number",
        )
    if 0 not in out.stages:
        raise NotACheckpointError(
            f"{loc.tag_dir}: the first stage's model file mp_rank_{tp_rank:02d}_model_states.pt is missing.",
            hint="Copy the complete checkpoint folder; each pipeline stage writes its own mp_rank_MM file.",
        )
    for (s, d), path in optims.items():
        if s in out.stages:
            out.stages[s].optims[d] = path
        else:
            out.findings.append(
                Finding(
                    Severity.ERROR,
                    "missing-stage",
                    f"Optimizer files for stage {s} exist but its model file "
                    f"mp_rank_{s * tp + tp_rank:02d}_model_states.pt is missing.",
                    path,
                    "Copy the complete folder.",
                )
            )
    return out


def missing_layers(files: PipelineFiles, tag_dir: str, tp_rank: int = 0) -> list[Finding]:
    """One error per layer whose parameters or buffers a stage lists but whose layer file is gone (at most 8,
    then a count): its 16-bit weights, buffers and frozen parameters are in that file alone."""
    names = [n for st in files.stages.values() if st.layout for n in st.layout.params]
    names += [n for st in files.stages.values() if st.model for n in st.model.buffer_names]
    wanted = {int(m.group(1)) for n in names if (m := LAYER_NAME.match(n))}
    missing = sorted(wanted - set(files.layers))
    model = f"-model_{tp_rank:02d}" if files.tp_named else ""
    hint = "Copy the complete checkpoint folder; every layer with parameters writes its own file."
    out = [
        Finding(
            Severity.ERROR,
            "missing-layer",
            f"The file of pipeline layer {i} (layer_{i:02d}{model}-model_states.pt) is missing: its 16-bit "
            "weights, buffers and frozen parameters are in that file alone.",
            tag_dir,
            hint,
        )
        for i in missing[:8]
    ]
    if len(missing) > 8:
        more = f"{len(missing) - 8} more layer files are missing."
        out.append(Finding(Severity.ERROR, "missing-layer", more, tag_dir, hint))
    return out
