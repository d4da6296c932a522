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

from collections.abc import Callable, Mapping
from functools import partial

from inspector.format.torchzip import TensorRef
from inspector.parse.layers import TensorFile
from inspector.parse.zero_off import UnfusedFp16, UnfusedParam
from inspector.scan.layout import Layout
from inspector.scan.layouts.pipeline.files import Stage
from inspector.scan.layouts.pipeline.names import with_copy
from inspector.scan.model import Finding, GroupInfo, Kind, RankGroup, Segment, Severity, TensorInfo
from inspector.scan.parallel_checks import CopyChecks
from inspector.system.bytesource import ByteSource

Cut = Callable[[tuple[int, ...]], UnfusedParam | None]  # the next master, cut to a candidate's shape
Named = tuple[TensorInfo, UnfusedParam]
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
        self.tied: list[tuple[str, int, bool]] = []  # (name, stage, by shape only) per later tied copy

    def refuse(self, file: str, message: str) -> None:
        self.failed = True
        self.findings.append(Finding(Severity.ERROR, "unnamed-params", message, file, _HINT))

    def _proves(self, p: UnfusedParam, name: str, ref: TensorRef) -> TensorInfo | None:
        """The master under `name` if its shape is the layer parameter's and its copy is the master cast;
        in fp32 (no master: the layer file's weight is it, stepped in place) the weight itself when the
        moments, keyed by the stage's running index as torch's own loader reads them back, have its shape."""
        if any(m.shape != ref.shape for m in (p.moments or {}).values()):
            return None  # the moments are keyed by the same index: theirs must be the parameter's shape
        if p.master is None:
            plain = p.moments is not None and ref.dtype == "float32"
            return TensorInfo(name, ref.shape, "float32", Kind.TRAINABLE, _segs(ref)) if plain else None
        if p.master.shape != ref.shape or p.master.dtype != "float32":
            return None
        t = with_copy(TensorInfo(name, p.master.shape, "float32", Kind.TRAINABLE, _segs(p.master)), ref)
        if not t.module_copy or self._copies.not_cast(t, t.module_copy):
            return None
        return t

    def _tied(self, cut: Cut, taken: set[str]) -> list[tuple[TensorInfo, UnfusedParam]]:
        """Every parameter an earlier stage claimed that a leading master proves to be: a tied module's
        candidates (a tied module first used inside this stage, out of layer order, is refused instead)."""
        free = {n for n, _ in self.pending}
        return [
            (t, p)
            for name, ref in self.params
            if name not in taken
            and name not in free
            and (p := cut(ref.shape)) is not None
            and (t := self._proves(p, name, ref)) is not None
        ]

    def _one(self, s: int, what: str, cut: Cut, plain: bool, taken: set[str], file: str) -> Named | None:
        """The next master of stage `s` (`what` says which) under its proven name, or None (a finding)."""
        nxt = self.pending[0] if self.pending else None
        p = cut(nxt[1].shape) if nxt else None
        t = self._proves(p, *nxt) if p is not None and nxt else None
        if t is not None and p is not None:
            self.leading = False  # the stage's own layers begin: from here strictly in index order
            return t, p
        if not self.leading:
            named = f"the next layer parameter, {nxt[0]} {nxt[1].shape}," if nxt else "no layer parameter"
            proof = "moments must have its shape" if plain else "16-bit copy it must equal cast"
            self.refuse(
                file,
                f"Stage {s}'s {what} is not {named} whose {proof}: the stage's parameter order is not its "
                "layer files' order (or a file is damaged), so the masters cannot be named safely.",
            )
            return None
        found = self._tied(cut, taken)
        if len(found) != 1:
            many = f"{len(found)} layer parameters" if found else "no layer parameter"
            compared = "shape" if plain else "shape and 16-bit copy"
            self.refuse(
                file,
                f"Stage {s}'s {what} proves equal to {many} ({', '.join(t.name for t, _ in found[:4]) or compared}"
                " compared), so it cannot be attributed to one parameter with proof.",
            )
            return None
        return found[0]

    def _take(self, s: int, g: int, got: Named, out: dict[str, TensorInfo]) -> TensorInfo:
        """Record a named master (with its moments) in stage `s`'s group `g`."""
        t, p = got
        if self.pending and t.name == self.pending[0][0]:
            self.pending.pop(0)
        else:
            self.tied.append((t.name, s, p.master is None))  # an earlier stage's: a tied copy
        moments = tuple((m, _segs(v)) for m, v in (p.moments or {}).items())
        out[t.name] = TensorInfo(
            t.name, t.shape, "float32", Kind.TRAINABLE, t.segments, None, g, moments, t.module_copy
        )
        return out[t.name]

    def stage(self, s: int, unfused: UnfusedFp16) -> Layout | None:
        """Stage `s`'s masters named, as a layout of its optimizer groups; None after a refusal. Per-parameter
        masters (or fp32 moments) are taken in turn; FP16_Optimizer's flat block is cut at a cursor, each
        candidate's shape giving the cut, so a piece is named only when its 16-bit copy proves it (the
        copies read through one `CopyChecks` a stage: each file opened once)."""
        with CopyChecks(self.source) as self._copies:
            return self._stage(s, unfused)

    def _stage(self, s: int, unfused: UnfusedFp16) -> Layout | None:
        if self.failed:
            return None
        out: dict[str, TensorInfo] = {}
        self.leading = True
        i = 0
        for g in range(len(unfused.flats) if unfused.fused else len(unfused.groups)):
            if unfused.fused:
                flat, off = unfused.flats[g], 0
                while off < flat.flat_numel():
                    what = f"fp32 master {i} (at element {off:,} of group {g}'s flat block)"
                    got = self._one(s, what, partial(flat.piece, off), False, set(out), unfused.file)
                    if got is None:
                        return None
                    off += self._take(s, g, got, out).numel
                    i += 1
                continue
            for p in unfused.groups[g]:
                what = f"{'optimizer entry' if p.master is None else 'fp32 master'} {i} (shape {p.shape()})"
                got = self._one(s, what, partial(_whole, p), unfused.plain, set(out), unfused.file)
                if got is None:
                    return None
                self._take(s, g, got, out)
                i += 1
        return _layout(out, unfused)

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
        for name, s, plain in self.tied:
            how = "its optimizer state has that shape" if plain else "proven equal to its layer file's copy"
            self.findings.append(
                Finding(
                    Severity.WARNING,
                    "tied-unnamed",
                    f"Stage {s} holds a tied copy of {name} ({how}); ZeRO off "
                    "writes the tied module's key (tied_modules.<key>) nowhere, so it keeps its layer file's "
                    "name.",
                    file,
                    "Rename it in the output if the model expects tied_modules.<key>.",
                )
            )
        return self.findings


def _whole(p: UnfusedParam, _shape: tuple[int, ...]) -> UnfusedParam:
    """A per-parameter master is offered whole to every candidate (its own shape is part of the proof)."""
    return p


def _layout(out: Mapping[str, TensorInfo], unfused: UnfusedFp16) -> Layout:
    """A named stage's optimizer groups (one rank: ZeRO off keeps every group whole in the stage file)."""
    groups: list[GroupInfo] = []
    for g in range(len(unfused.flats) if unfused.fused else len(unfused.groups)):
        numel = sum(t.numel for t in out.values() if t.group == g)
        count = sum(1 for t in out.values() if t.group == g)
        hyper = unfused.hyperparams[g] if g < len(unfused.hyperparams) else {}
        groups.append(GroupInfo(g, count, numel, numel, numel, hyper))
    rank_groups = [tuple(RankGroup(gi.index, gi.numel, gi.numel, 0) for gi in groups)]
    return Layout(dict(out), tuple(groups), rank_groups, "float32")


__all__ = ["StageMasters"]
