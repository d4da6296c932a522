"""Native MoE without ZeRO (`deepspeed.moe.layer.MoE`, `zero_optimization.stage` 0; FORMAT.md §3.7).

DeepSpeed then wraps a torch optimizer in `FP16_UnfusedOptimizer` (for bf16 too): each expert-parallel rank
E writes `expp_rank_E_mp_rank_00_optim_states.pt`, whose `fp32_groups` hold one full fp32 master per
parameter, per optimizer group, in the group's parameter order, with the torch optimizer's moments keyed by
the same running index. No names: the dense groups hold the module's parameters in module order (`module` of
`mp_rank_00_model_states.pt`, buffers left out), the `ep_size_E` group the rank's local experts in order
(global expert `E·n_local + j`, each expert's keys as its `layer_L_expert_G` file lists them). That match is
proven, not assumed: every shape must agree in sequence, and every 16-bit module copy must be its matched
master cast (the optimizer copies masters into the module after each step); otherwise the scan refuses with
a finding rather than guess. In fp32 the expp files hold the torch optimizer's own state (moments only): the
fp32 module and expert weights are the masters, matched to those moments by the same order and their shapes.
A fused Adam in fp16 (FP16_Optimizer) keeps each group as one flat block: it is cut name by name, in order.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from typing import Any

from inspector.format.torchzip import TensorRef
from inspector.parse.layers import ParallelDims, TensorFile
from inspector.parse.states import ModelStates
from inspector.parse.zero_off import UnfusedFp16, UnfusedParam
from inspector.scan.assemble import record
from inspector.scan.claims import claim, damaging, expert_role, expp_role, model_role
from inspector.scan.files import RankFiles, load_or_finding
from inspector.scan.holding import Holding, expert_spans
from inspector.scan.layouts.base import tree_at
from inspector.scan.layouts.moe.scanner import EXPERT_NAME, missing_experts
from inspector.scan.layouts.moe.zero0_files import Zero0Files, zero0_files
from inspector.scan.layouts.moe.zero0_sizes import (
    expert_names,
    first_hyper,
    layer_sizes,
    load_optimizer,
    named_groups,
    pieces,
    size_of,
    wrapper_name,
)
from inspector.scan.layouts.pipeline.names import plain, with_copy
from inspector.scan.locate import Location
from inspector.scan.metadata import file_size, item
from inspector.scan.model import (
    Checkpoint,
    FileInfo,
    Finding,
    GroupInfo,
    Kind,
    Parallel,
    RankGroup,
    RankInfo,
    Segment,
    Severity,
    TensorInfo,
)
from inspector.scan.parallel_checks import CopyChecks

_EP_NAME = re.compile(r"^ep_size_(\d+)$")
_WORDS = "this MoE checkpoint without ZeRO (its optimizer files are expp_rank_E_…)"
_HINT = "Save with ZeRO stage 1 or 2, whose optimizer files name every parameter."


def scan_moe_zero0(loc: Location, names: Sequence[str], trees: dict[str, Any]) -> Checkpoint:
    """Scan a ZeRO-off native-MoE tag folder: masters matched to names by order, shapes and their copies;
    `trees`: what the claims loaded (`Found.trees`), taken instead of loading a file again."""
    return _Zero0(loc, zero0_files(loc, names)).build(trees)


class _Zero0:
    def __init__(self, loc: Location, files: Zero0Files) -> None:
        self.loc = loc
        self.f = files
        self.findings: list[Finding] = list(loc.findings)
        self.groups_rank: dict[int, int] = {}  # optimizer group -> the expert-parallel rank holding it
        self.group_size: dict[int, int] = {}  # expert group -> its expert-parallel size
        self.sizes: set[int] = set()  # the expert-parallel sizes the groups name
        self.copies = CopyChecks(loc.source)  # the copies' reads: each file opened once, closed by `build`

    def add(self, code: str, message: str, file: str | None = None, hint: str = _HINT) -> None:
        self.findings.append(Finding(Severity.ERROR, code, message, file, hint))

    def build(self, trees: dict[str, Any]) -> Checkpoint:
        with self.copies:
            return self._build(trees)

    def _build(self, trees: dict[str, Any]) -> Checkpoint:
        tree = tree_at(trees, self.f.model, self.loc.source)
        model = ModelStates.parse(tree, self.f.model)
        dims = ParallelDims.parse(tree, self.f.model)
        opts = {  # read first: the expert-parallel size their groups name bounds the files' roles
            e: o
            for e, p in sorted(self.f.expp.items())
            if (o := load_or_finding(p, self.loc.source, self.findings, load_optimizer)) is not None
        }
        ep = self._ep_size(opts)
        self._claim(dims, ep)
        opts = {e: o for e, o in opts.items() if e in self.f.expp}
        rf = RankFiles(experts=self.f.experts, present=self.f.present)
        self.findings += missing_experts(model, dims, rf, self.loc.tag_dir)
        copies = self._expert_copies()
        for e in [e for e in range(ep) if e not in self.f.expp][:8]:
            self.add(
                "missing-rank",
                f"The optimizer file of expert-parallel rank {e} (expp_rank_{e}_mp_rank_00_optim_states.pt) "
                "is missing.",
                self.loc.tag_dir,
                "Copy the complete checkpoint folder; every expert-parallel rank writes one.",
            )
        tensors: list[TensorInfo] = []
        groups: list[GroupInfo] = []
        if len(opts) == ep and not damaging(self.findings):
            tensors, groups = self._tensors(model, dims, opts, copies, ep)
        tensors += self._rest(model, {t.name for t in tensors})
        return self._checkpoint(model, opts, tensors, groups, ep)

    def _claim(self, dims: ParallelDims, ep: int) -> None:
        """Every file of the tag folder claimed (scan/claims.py): the model states, one optimizer file per
        expert-parallel rank, the expert files of the recorded MoE layers; the rest are stray-file errors."""
        expp = expp_role(ep, 1)
        counts = dict(enumerate(dims.num_experts)) if dims.num_experts is not None else None
        experts = expert_role(counts, 1)
        claims = claim(self.loc.tag_dir, self.f.names, [model_role(1), expp, experts], _WORDS)
        self.findings += claims.findings
        self.f.expp = {k[0]: p for k, p in claims.of(expp).items()}
        self.f.experts = {(k[0], k[1]): p for k, p in claims.of(experts).items()}

    def _ep_size(self, opts: Mapping[int, UnfusedFp16]) -> int:
        """The expert-parallel size the `ep_size_E` group names, bounded by the files present (one
        `expp_rank` file per expert-parallel rank)."""
        self.sizes = {
            int(m.group(1))
            for o in opts.values()
            for h in o.hyperparams
            if (m := _EP_NAME.match(str(h.get("name", ""))))
        }
        ep = max(self.sizes, default=max(self.f.expp, default=0) + 1)
        if ep > self.f.present:
            self.add(
                "world-size",
                f"The expert group is named ep_size_{ep:,}, but the tag folder holds only {self.f.present} files.",
                self.loc.tag_dir,
                "The optimizer files are damaged or crafted.",
            )
            return max(self.f.expp, default=0) + 1
        return ep

    def _expert_copies(self) -> dict[int, list[dict[str, TensorRef]]]:
        """Per MoE layer, its global experts' 16-bit tensors in order, up to the first missing or unreadable
        file (a finding says which)."""
        out: dict[int, list[dict[str, TensorRef]]] = {}
        for (layer, e), path in sorted(self.f.experts.items()):
            tf = load_or_finding(path, self.loc.source, self.findings, TensorFile.parse)
            experts = out.setdefault(layer, [])
            if tf is not None and e == len(experts):
                experts.append(dict(tf.tensors))
        return out

    def _tensors(
        self,
        model: ModelStates,
        dims: ParallelDims,
        opts: Mapping[int, UnfusedFp16],
        copies: Mapping[int, list[dict[str, TensorRef]]],
        ep: int,
    ) -> tuple[list[TensorInfo], list[GroupInfo]]:
        """Each master under its proven name: dense groups from rank 0, each `ep_size_E` group from the first E
        ranks (the others hold replicas), every group found by name in each rank's own list."""
        dense_names = [(n, r) for n, r in model.module.items() if n not in model.buffer_names]
        by_rank = {e: named_groups(o) for e, o in opts.items()}
        sizes = self._layer_sizes(dims, by_rank[0], copies, ep)
        out: list[TensorInfo] = []
        groups: list[GroupInfo] = []
        for name, hyper in (first_hyper(opts[0]) if sizes is not None else {}).items():
            size = size_of(hyper, ep)
            for e in range(size or 1):
                wanted = expert_names(copies, dims, sizes or {}, size, e) if size else dense_names
                params, names = pieces(opts[e], by_rank[e].get(name, []), wanted, not size)
                if not size:
                    dense_names = dense_names[len(names) :]
                named = self._matched(params, names, len(groups), opts[e].file)
                if named is None:
                    return [], []
                out += named
                replicas = [(r, g) for r, g in by_rank.items() if r != e and r % (size or 1) == e]
                self._same_replicas(
                    named, [pieces(opts[r], g.get(name, []), names, False)[0] for r, g in replicas]
                )
                numel = sum(t.numel for t in named)
                self.groups_rank[len(groups)] = e
                self.group_size[len(groups)] = size or 0
                groups.append(
                    GroupInfo(
                        len(groups),
                        len(named),
                        numel,
                        numel,
                        numel,
                        {**hyper, "ep_rank": e} if size else dict(hyper),
                    )
                )
        if dense_names and sizes is not None:
            self.add(
                "unnamed-params",
                f"{len(dense_names)} module parameter(s) (e.g. {dense_names[0][0]}) have no fp32 master.",
                self.f.model,
            )
            return [], []
        return out, groups

    def _layer_sizes(
        self,
        dims: ParallelDims,
        groups0: Mapping[str, Sequence[UnfusedParam]],
        copies: Mapping[int, list[dict[str, TensorRef]]],
        ep: int,
    ) -> dict[int, int] | None:
        """MoE layer -> its expert-parallel size: the one size there is, or (several) what rank 0's groups
        prove (`moe_zero0_sizes`); None after a finding when they cannot."""
        if len(self.sizes) < 2:
            return dict.fromkeys(copies, ep)
        by_size = {s: groups0.get(f"ep_size_{s}", []) for s in sorted(self.sizes)}
        got, why = layer_sizes(copies, dims.num_experts or (), by_size, self._casts)
        if got is None:
            self.add(
                "unnamed-params",
                f"The expert groups have several expert-parallel sizes ({sorted(self.sizes)}), which DeepSpeed "
                f"records nowhere per MoE layer, and the masters do not tell them apart: {why}.",
                self.loc.tag_dir,
            )
        return got

    def _casts(self, params: Sequence[UnfusedParam], names: Sequence[tuple[str, TensorRef]]) -> bool:
        return all(self._proved(p, n, r, None) is not None for p, (n, r) in zip(params, names, strict=True))

    def _same_replicas(self, named: Sequence[TensorInfo], others: Sequence[Sequence[UnfusedParam]]) -> None:
        """Every other expert-parallel rank's copy of a dense group (a data-parallel replica DeepSpeed keeps
        equal) holds rank 0's bytes; the output reads rank 0's, so a damaged copy is said, not hidden."""
        for copy in others:
            for t, p in zip(named, copy, strict=False):
                if p.master is None:
                    return  # fp32: the replicas keep moments only; the weights are written once
                other = TensorInfo(t.name, p.master.shape, "float32", Kind.TRAINABLE, _segs(p.master))
                if self.copies.differ(t, other):
                    self.add(
                        "replica-differ",
                        f"The fp32 master of {t.name} differs between expert-parallel ranks' optimizer files: "
                        "DeepSpeed keeps these data-parallel copies equal, so a file is damaged or from "
                        "another save.",
                        p.master.path,
                        "Restore the tag folder from one save.",
                    )
                    return

    def _matched(
        self, params: Sequence[UnfusedParam], names: Sequence[tuple[str, TensorRef]], group: int, file: str
    ) -> list[TensorInfo] | None:
        if len(params) != len(names) or any(
            p.shape() != r.shape for p, (_, r) in zip(params, names, strict=False)
        ):
            self.add(
                "unnamed-params",
                f"Optimizer group {group} of {os.path.basename(file)} holds {len(params)} unnamed fp32 masters "
                f"whose shapes do not follow the {len(names)} module parameters in order, so they cannot be "
                "named safely.",
                file,
            )
            return None
        out = []
        for p, (name, ref) in zip(params, names, strict=True):
            t = self._proved(p, name, ref, group)
            if t is None:
                self.add(
                    "unnamed-params",
                    f"The fp32 master matched to {name} by order is not what its 16-bit copy holds: the "
                    "optimizer's parameter order is not the module's, so the masters cannot be named safely.",
                    file,
                )
                return None
            out.append(t)
        return out

    def _proved(self, p: UnfusedParam, name: str, ref: TensorRef, group: int | None) -> TensorInfo | None:
        """The master as `name`, when its 16-bit module copy `ref` is the master cast (else None); in fp32
        (no master) the module's own weight, when its moments have its shape."""
        moments = tuple((m, _segs(v)) for m, v in (p.moments or {}).items())
        if p.master is None:
            fits = ref.dtype == "float32" and all(v.shape == ref.shape for v in (p.moments or {}).values())
            return (
                TensorInfo(name, ref.shape, "float32", Kind.TRAINABLE, _segs(ref), None, group, moments)
                if fits
                else None
            )
        t = TensorInfo(name, p.master.shape, "float32", Kind.TRAINABLE, _segs(p.master), None, group, moments)
        t = with_copy(t, ref)
        return None if not t.module_copy or self.copies.not_cast(t, t.module_copy) else t

    def _rest(self, model: ModelStates, named: set[str]) -> list[TensorInfo]:
        """Buffers, and (with every master named) frozen module tensors, from the model states."""
        out = []
        complete = not damaging(self.findings)
        for n, ref in model.module.items():
            if n in model.buffer_names:
                out.append(plain(n, ref, Kind.BUFFER))
            elif n not in named and complete:
                out.append(plain(n, ref, Kind.FROZEN))
        return out

    def _checkpoint(
        self,
        model: ModelStates,
        opts: Mapping[int, UnfusedFp16],
        tensors: list[TensorInfo],
        groups: list[GroupInfo],
        ep: int,
    ) -> Checkpoint:
        files = [FileInfo.stat(p, "optim", e) for e, p in sorted(self.f.expp.items())]
        files += [FileInfo.stat(self.f.model, "model", None)]
        files += [FileInfo.stat(p, "expert", None) for _, p in sorted(self.f.experts.items())]
        ranks = [
            RankInfo(
                e,
                self.f.expp.get(e),
                self.f.model if e == 0 else None,
                file_size(self.f.expp.get(e)),
                file_size(self.f.model) if e == 0 else 0,
                tuple(
                    RankGroup(g.index, g.numel, g.numel, 0)
                    for g in groups
                    if g.hyperparams.get("ep_rank", e) == e
                ),
            )
            for e in range(ep)
        ]
        o0 = opts.get(0)
        first = o0.groups[0][0] if o0 and o0.groups and o0.groups[0] else None
        copies = [t.module_copy[0].dtype for t in tensors if t.module_copy]
        dp = model.dp_world_size or ep
        return record(
            self.loc,
            model,
            stage=0,
            world_size=max(dp, ep),
            optimizer=wrapper_name(o0),
            compute_dtype=copies[0] if copies else "float32",
            master_dtype="float32",
            optimizer_step=item(first.step) if first else None,
            loss_scale=o0.loss_scale if o0 else None,
            dynamic_loss_scale=None,
            files=files,
            ranks=ranks,
            groups=groups,
            tensors=tensors,
            findings=self.findings,
            module_copy_bytes=sum(s.nbytes for t in tensors for s in t.module_copy),
            parallel=Parallel(
                "expert", ep=ep, dp=max(dp, ep), placement=self._placement(tensors, ep, max(dp, ep))
            ),
        )

    def _placement(self, tensors: Sequence[TensorInfo], ep: int, world: int) -> tuple[Holding, ...]:
        """Which ranks hold which experts, per MoE layer, as the ZeRO-1/2 MoE scan records it: expert-parallel
        rank e is every rank r with r mod ep = e (only expert-data-parallel rank 0 writes a file)."""
        by_layer: dict[str, dict[int, list[int]]] = {}
        for t in tensors:
            if (m := EXPERT_NAME.match(t.name)) and t.group is not None:
                step = self.group_size.get(t.group) or ep
                ranks = list(range(self.groups_rank.get(t.group, 0), world, step))
                by_layer.setdefault(m.group(1).rstrip("."), {}).setdefault(int(m.group(2)), ranks)
        return tuple(Holding(layer, expert_spans(by_expert)) for layer, by_expert in sorted(by_layer.items()))


def _segs(ref: TensorRef) -> tuple[Segment, ...]:
    return tuple(Segment(ref.path, off, n, ref.dtype) for off, n in ref.runs())


__all__ = ["scan_moe_zero0"]
