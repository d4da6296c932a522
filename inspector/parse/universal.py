"""The files of a DeepSpeed universal checkpoint as typed values (FORMAT.md §4): `zero/<param>/<state>.pt`
holds `{'param': tensor, 'cat_dim': ...}` (ours and DeepSpeed's stage-1/2 output) or a bare flattened tensor
(DeepSpeed's stage-3 output); `step.pt` a bare int or 0-d tensor; `zero/optimizer_state.pt` the loss scaler
and the optimizer's hyperparameters and steps. Anything else is refused with one `InputError`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from inspector.format.torchzip import TensorRef
from inspector.parse.states import Scalar, finite
from inspector.parse.tree import Node


def param_tensor(tree: Any, file: str) -> TensorRef:
    """The tensor of a `zero/<param>/{fp32,exp_avg,exp_avg_sq}.pt` file."""
    node = Node(tree, file)
    if node.is_mapping():
        node = node.at("param")
    return node.tensor()


def step_value(tree: Any, file: str) -> Scalar:
    """`step.pt`: an int, a float or a 0-d tensor."""
    v = tree
    if isinstance(v, TensorRef):
        if v.numel != 1:
            raise Node(v, file).fail(f"is a tensor of {v.numel} elements, not a step counter")
        return v
    if isinstance(v, int) and not isinstance(v, bool):
        return Node(v, file).integer(0, 1 << 62)
    return Node(v, file).number()


@dataclass(frozen=True)
class UniversalOptimizer:
    """`zero/optimizer_state.pt`: what a scan shows of it."""

    loss_scale: float | None
    dynamic_loss_scale: bool | None
    step: Scalar

    @classmethod
    def parse(cls, tree: Any, file: str) -> UniversalOptimizer:
        root = Node(tree, file)
        if not root.is_mapping():
            raise root.fail("is not a dict of optimizer state")
        scaler = root.at("loss_scaler").value
        scale = getattr(scaler, "__dict__", {}).get("cur_scale") if scaler is not None else None
        dyn = root.at("dynamic_loss_scale").value
        step: Scalar = None
        osd = root.at("optimizer_state_dict")
        if osd.is_mapping():
            state = osd.at("state")
            if state.is_mapping():
                first = next(iter(state.items_any()), None)
                if first is not None and first[1].is_mapping():
                    raw = first[1].at("step").value
                    if raw is not None:
                        step = step_value(raw, file)
        return cls(finite(scale), dyn if isinstance(dyn, bool) else None, step)
