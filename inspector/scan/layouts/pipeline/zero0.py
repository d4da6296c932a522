"""Pipeline stages saved with ZeRO off in fp16 (`FP16_UnfusedOptimizer`; FORMAT.md §3.6).

Each stage's `mp_rank_SS_model_states.pt` holds the stage's fp32 masters under `optimizer.fp32_groups`, one
per parameter, without names, in the stage module's parameter order: its tied modules first, then its layers
by index. Stage boundaries are written nowhere but in the sizes, so the masters are named by walking the layer
files in index order, stage after stage, and every name is *proven*: the shape must be the next layer
parameter's, and the 16-bit copy in that layer file must be the master cast (the optimizer copies masters into
the module after every step). A stage's leading masters may instead be a tied module's: they are named after
the one layer file parameter (of any stage) they prove equal to; none or several such candidates refuse.

A tied module's key (`tied_modules.<key>`) is written nowhere in such a save, so a tied weight keeps the name
of the layer file that holds it (`0.weight`), as DeepSpeed's own layer-file loading addresses it; a warning
says so. Anything that does not prove refuses with a finding rather than guess a name.
"""

from __future__ import annotations

from collections.abc import Mapping

from inspector.format.torchzip import TensorRef
from inspector.parse.layers import TensorFile, UnfusedFp16, UnfusedParam
from inspector.scan.layout import Layout
from inspector.scan.layouts.pipeline.files import Stage
from inspector.scan.layouts.pipeline.names import with_copy
from inspector.scan.model import Finding, GroupInfo, Kind, RankGroup, Segment, Severity, TensorInfo
from inspector.scan.parallel_checks import copy_is_not_cast
from inspector.system.bytesource import ByteSource

_HINT = (
    "Save with ZeRO stage 1 (or bf16), whose files name every parameter; the 16-bit layer files are complete "
    "weights in the meantime."
)


def _segs(ref: TensorRef) -> tuple[Segment, ...]:
    return tuple(Segment(ref.path, off, n, ref.dtype) for off, n in ref.runs())


class StageMasters:
    """Names the unnamed fp32 masters of a pipeline's ZeRO-off stages, called stage by stage in order: each
    stage takes the next layer parameters (index order) its masters prove to be."""

    def __init__(self, layer_files: Mapping[int, TensorFile], buffers: set[str], source: ByteSource) -> None:
        self.source = source
        self.params: list[tuple[str, TensorRef]] = [
            (f"{i}.{k}", ref)
            for i, lf in sorted(layer_files.items())
            for k, ref in lf.tensors.items()
            if f"{i}.{k}" not in buffers
        ]
        self.pending = list(self.params)  # layer parameters no stage has claimed yet, in index order
        self.findings: list[Finding] = []
        self.failed = False  # after one stage fails, later stages' starting point is unknown
        self.tied: list[tuple[str, int]] = []  # (name, stage) of each tied copy a later stage holds

    def refuse(self, file: str, message: str) -> None:
        self.failed = True
        self.findings.append(Finding(Severity.ERROR, "unnamed-params", message, file, _HINT))

    def _proves(self, p: UnfusedParam, name: str, ref: TensorRef) -> TensorInfo | None:
        """The master under `name` if its shape is the layer parameter's and its copy is the master cast."""
        if p.master.shape != ref.shape or p.master.dtype != "float32":
            return None
        if any(m.shape != ref.shape for m in (p.moments or {}).values()):
            return None  # the moments are keyed by the same index: theirs must be the parameter's shape
        t = with_copy(TensorInfo(name, p.master.shape, "float32", Kind.TRAINABLE, _segs(p.master)), ref)
        if not t.module_copy or copy_is_not_cast(t, t.module_copy, self.source):
            return None
        return t

    def _tied(self, p: UnfusedParam, taken: set[str]) -> list[TensorInfo]:
        """Every parameter an earlier stage claimed that a leading master proves to be: a tied module's
        candidates (a tied module first used inside this stage, out of layer order, is refused instead)."""
        free = {n for n, _ in self.pending}
        return [
            t
            for name, ref in self.params
            if name not in taken and name not in free and (t := self._proves(p, name, ref)) is not None
        ]

    def _one(
        self, s: int, i: int, p: UnfusedParam, leading: bool, taken: set[str], file: str
    ) -> TensorInfo | None:
        """Master `i` of stage `s` under its proven name, or None (with a finding)."""
        nxt = self.pending[0] if self.pending else None
        if not leading:
            t = self._proves(p, *nxt) if nxt else None
            if t is None:
                what = f"the next layer parameter, {nxt[0]} {nxt[1].shape}," if nxt else "no layer parameter"
                self.refuse(
                    file,
                    f"Stage {s}'s fp32 master {i} (shape {p.master.shape}) is not {what} whose 16-bit copy it "
                    "must equal cast: the stage's parameter order is not its layer files' order (or a file is "
                    "damaged), so the masters cannot be named safely.",
                )
            return t
        found = self._tied(p, taken)
        if len(found) != 1:
            many = f"{len(found)} layer parameters" if found else "no layer parameter"
            self.refuse(
                file,
                f"Stage {s}'s fp32 master {i} (shape {p.master.shape}) proves equal to {many} "
                f"({', '.join(t.name for t in found[:4]) or 'shape and 16-bit copy compared'}), so it cannot be "
                "attributed to one parameter with proof.",
            )
            return None
        return found[0]

    def stage(self, s: int, unfused: UnfusedFp16) -> Layout | None:
        """Stage `s`'s masters named, as a layout of its optimizer groups; None after a refusal."""
        if self.failed:
            return None
        out: dict[str, TensorInfo] = {}
        groups: list[GroupInfo] = []
        leading = True
        i = 0
        for g, group in enumerate(unfused.groups):
            for p in group:
                if leading and self.pending and self._proves(p, *self.pending[0]) is not None:
                    leading = False  # the stage's own layers begin: from here strictly in index order
                t = self._one(s, i, p, leading, set(out), unfused.file)
                if t is None:
                    return None
                if self.pending and t.name == self.pending[0][0]:
                    self.pending.pop(0)
                else:
                    self.tied.append((t.name, s))  # claimed by an earlier stage: a tied module's copy
                moments = tuple((m, _segs(v)) for m, v in (p.moments or {}).items())
                out[t.name] = TensorInfo(
                    t.name, t.shape, "float32", Kind.TRAINABLE, t.segments, None, g, moments, t.module_copy
                )
                i += 1
            numel = sum(t.numel for t in out.values() if t.group == g)
            count = sum(1 for t in out.values() if t.group == g)
            hyper = unfused.hyperparams[g] if g < len(unfused.hyperparams) else {}
            groups.append(GroupInfo(g, count, numel, numel, numel, hyper))
        rank_groups = [tuple(RankGroup(gi.index, gi.numel, gi.numel, 0) for gi in groups)]
        return Layout(out, tuple(groups), rank_groups, "float32")

    def finish(self, stages: Mapping[int, Stage], file: str) -> list[Finding]:
        """The findings: layer parameters no master claimed (frozen, or a stage lost) and the tied weights
        named after their layer file. After any refusal no ZeRO-off stage keeps names: one stage's order
        is proven only together with its neighbours'."""
        if not self.failed and self.pending:
            self.refuse(
                file,
                f"{len(self.pending)} layer file parameter(s) (e.g. {self.pending[0][0]}) have no fp32 master in "
                "any stage: frozen parameters or a lost stage leave the masters' order unprovable.",
            )
        if self.failed:
            for st in stages.values():
                if not st.optims:
                    st.layout = None
            return self.findings
        for name, s in self.tied:
            self.findings.append(
                Finding(
                    Severity.WARNING,
                    "tied-unnamed",
                    f"Stage {s} holds a tied copy of {name} (proven equal to its layer file's copy); ZeRO off "
                    "writes the tied module's key (tied_modules.<key>) nowhere, so it keeps its layer file's "
                    "name.",
                    file,
                    "Rename it in the output if the model expects tied_modules.<key>.",
                )
            )
        return self.findings


def fused_refusal(stage: int, file: str) -> Finding:
    """FP16_Optimizer (a fused Adam) keeps one flat fp32 block per group: where one parameter ends is
    written nowhere but in the sizes, and a tied module's key nowhere, so its masters are not named."""
    return Finding(
        Severity.ERROR,
        "unnamed-params",
        f"Stage {stage} was saved with ZeRO off in fp16 (FP16_Optimizer): it holds one flat fp32 block per "
        "group, its parameter boundaries written nowhere but in the sizes, and a tied module's key is "
        "written nowhere, so they cannot be matched to the pipeline's parameters safely.",
        file,
        _HINT,
    )


__all__ = ["StageMasters", "fused_refusal"]
