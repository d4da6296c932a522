"""The optimizer a model-states file holds when ZeRO is off (FORMAT.md "More DeepSpeed layouts"), as frozen,
typed records: FP16_UnfusedOptimizer (one fp32 master per parameter), FP16_Optimizer (a fused Adam: one flat
fp32 block per group, its parameter boundaries written nowhere but in the sizes) and, in fp32, the torch
optimizer's own state dict (the module's weights are the masters). Plain data-parallel, pipeline, native MoE
and AutoTP runs without ZeRO all save one of these three.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from types import MappingProxyType
from typing import Any

from inspector.format.torchzip import TensorRef
from inspector.parse.states import Scalar, _moments
from inspector.parse.tree import Node

_UNFUSED_HYPER = ("lr", "weight_decay", "betas", "eps", "name", "moe")  # name, moe: native MoE's group labels


@dataclass(frozen=True)
class UnfusedParam:
    """One parameter's fp32 master and Adam state in an FP16_UnfusedOptimizer (ZeRO off, fp16); `master`
    None in a plain torch optimizer's state (ZeRO off in fp32: the module's own weight is the master)."""

    master: TensorRef | None
    moments: Mapping[str, TensorRef] | None
    step: Scalar

    def shape(self) -> tuple[int, ...] | None:
        """The parameter's shape as this entry records it: its master's, else its moments' (None: neither)."""
        if self.master is not None:
            return self.master.shape
        return next(iter(self.moments.values())).shape if self.moments else None

    def flat_numel(self) -> int:
        """Elements of a flat group block (FP16_Optimizer's `fp32_groups_flat` entry); 0 if it is not one."""
        m = self.master
        return m.numel if m is not None and len(m.shape) == 1 and m.is_contiguous() else 0

    def piece(self, off: int, shape: tuple[int, ...]) -> UnfusedParam | None:
        """The piece of a flat group block (master and flat moments alike) at element `off`, in `shape`;
        None past its end. Moments of another size than the block are left out (not this block's)."""
        n, total = math.prod(shape), self.flat_numel()
        if self.master is None or not total or off + n > total:
            return None
        moments = (
            self.moments if self.moments and all(v.numel == total for v in self.moments.values()) else {}
        )
        cut = {k: _piece(v, off, shape) for k, v in moments.items()}
        return UnfusedParam(_piece(self.master, off, shape), cut or None, self.step)


def _piece(ref: TensorRef, off: int, shape: tuple[int, ...]) -> TensorRef:
    strides = tuple(math.prod(shape[i + 1 :]) for i in range(len(shape)))
    return replace(ref, storage_offset=ref.storage_offset + off, shape=shape, stride=strides)


@dataclass(frozen=True)
class UnfusedFp16:
    """`model_states['optimizer']` of a ZeRO-off fp16 run with a non-fused Adam (FP16_UnfusedOptimizer):
    `fp32_groups` holds one full fp32 tensor per parameter, in the optimizer's parameter order, and the torch
    optimizer's `state` is keyed by the same running index. No names: the order is the stage module's
    parameter order (tied modules first, then layers by index)."""

    file: str
    groups: tuple[tuple[UnfusedParam, ...], ...]
    loss_scale: float | None
    hyperparams: tuple[Mapping[str, Any], ...]
    fused: bool = False  # FP16_Optimizer (a fused Adam): `fp32_groups_flat`, flat blocks whose parameter
    # boundaries are written nowhere but in the sizes; `groups` are then empty and `flats` holds the blocks
    plain: bool = False  # ZeRO off in fp32: the torch optimizer's own state_dict, no masters (`master` None)
    flats: tuple[UnfusedParam, ...] = ()  # FP16_Optimizer: per group its flat fp32 master and flat moments

    @classmethod
    def parse(cls, tree: Any, file: str) -> UnfusedFp16 | None:
        """The record, or None when the model states hold no such optimizer (ZeRO on, or another wrapper)."""
        root = Node(tree, file)
        opt = root.at("optimizer") if root.is_mapping() else Node(None, file)
        if opt.is_mapping() and opt.has("fp32_groups_flat") and not opt.has("fp32_groups"):
            return _fused(opt, file)  # FP16_Optimizer: one flat block per group, no names
        if opt.is_mapping() and opt.has("state") and opt.has("param_groups") and not opt.has("fp32_groups"):
            return _plain(tree, file)
        if not opt.is_mapping() or not opt.has("fp32_groups"):
            return None
        state, hyper = _osd(opt, file)
        groups = []
        index = 0
        for group in opt.at("fp32_groups").seq(4096):
            params = []
            for p in group.seq():
                st = (
                    Node(state.value.get(index), file, f"{state.path}[{index}]")
                    if state.is_mapping()
                    else None
                )
                moments, step = _moments(st)
                params.append(UnfusedParam(p.tensor(), moments, step))
                index += 1
            groups.append(tuple(params))
        return cls(file, tuple(groups), _scale(opt), hyper)


def _scale(opt: Node) -> float | None:
    scale = opt.at("cur_scale").value
    return float(scale) if isinstance(scale, int | float) and not isinstance(scale, bool) else None


@dataclass(frozen=True)
class TorchOptimizer:
    """`model_states['optimizer']` of a ZeRO-off fp32 run: the torch optimizer's own state dict (the module's
    fp32 weights are the masters). `groups` are each group's parameter indices (running over the module's
    parameters in order); `moments[i]` parameter i's Adam moments and step."""

    file: str
    groups: tuple[tuple[int, ...], ...]
    moments: Mapping[int, tuple[Mapping[str, TensorRef] | None, Scalar]]
    hyperparams: tuple[Mapping[str, Any], ...]

    @classmethod
    def parse(cls, tree: Any, file: str) -> TorchOptimizer | None:
        """The record, or None when `optimizer` is not a torch optimizer's state dict."""
        root = Node(tree, file)
        opt = root.at("optimizer") if root.is_mapping() else Node(None, file)
        if not opt.is_mapping() or not opt.has("state") or not opt.has("param_groups"):
            return None
        state = opt.at("state")
        groups, hyper = [], []
        for g in opt.at("param_groups").seq(4096):
            if not g.is_mapping():
                raise g.fail("is not an optimizer parameter group")
            groups.append(tuple(p.integer(0, 1 << 40) for p in g.at("params").seq()))
            hyper.append(MappingProxyType({k: g.at(k).json() for k in _UNFUSED_HYPER if g.has(k)}))
        moments = {
            i: _moments(Node(state.value.get(i), file, f"{state.path}[{i}]") if state.is_mapping() else None)
            for group in groups
            for i in group
        }
        return cls(file, tuple(groups), MappingProxyType(moments), tuple(hyper))


def _osd(opt: Node, file: str) -> tuple[Node, tuple[Mapping[str, Any], ...]]:
    """The wrapped torch optimizer's state (by parameter index) and each group's hyperparameters: both
    FP16 optimizers keep them under `optimizer_state_dict`."""
    osd = opt.at("optimizer_state_dict")
    state = osd.at("state") if osd.is_mapping() else Node(None, file)
    pgs = osd.at("param_groups").seq(4096) if osd.is_mapping() and osd.has("param_groups") else []
    hyper = tuple(
        MappingProxyType({k: g.at(k).json() for k in _UNFUSED_HYPER if g.has(k)})
        for g in pgs
        if g.is_mapping()
    )
    return state, hyper


def _fused(opt: Node, file: str) -> UnfusedFp16:
    """FP16_Optimizer's state: `fp32_groups_flat[g]` is group g's parameters' fp32 masters end to end
    (unpadded, in the optimizer's order), its Adam moments equally flat under the group's one index."""
    state, hyper = _osd(opt, file)
    flats = []
    for g, flat in enumerate(opt.at("fp32_groups_flat").seq(4096)):
        index = g  # each group holds its one flat tensor, numbered in group order
        st = Node(state.value.get(index), file, f"{state.path}[{index}]") if state.is_mapping() else None
        moments, step = _moments(st)
        flats.append(UnfusedParam(flat.tensor(), moments, step))
    return UnfusedFp16(file, (), _scale(opt), hyper, fused=True, flats=tuple(flats))


def _plain(tree: Any, file: str) -> UnfusedFp16:
    """A torch optimizer's own state_dict (ZeRO off in fp32), as `TorchOptimizer` reads it, in the unfused
    record's shape: each group its parameters (no masters: the module's weights are) with their moments."""
    opt = TorchOptimizer.parse(tree, file)
    assert opt is not None  # the caller saw `state` and `param_groups`
    groups = tuple(tuple(UnfusedParam(None, *opt.moments[i]) for i in g) for g in opt.groups)
    return UnfusedFp16(file, groups, None, opt.hyperparams, plain=True)
