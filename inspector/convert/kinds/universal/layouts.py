"""What a universal checkpoint needs from a model-parallel layout beyond the joined tensors (FORMAT.md §4).

Tensor parallel: each parameter's file carries the keys DeepSpeed's loader splits it by again for a
tensor-parallel target without AutoTP metadata of its own (`universal_checkpoint.load_hp_checkpoint_state`),
the ones `ds_to_universal`'s category path writes: `cat_dim` 0 or 1 (1 when the shards sit side by side),
nothing for a replicated parameter, and `vocab_tensor` for a vocabulary-parallel one (its padding rows are
already cut by the scan). Which is which is read from the shapes the shards recorded (`param_shapes` of
shard 0) against the joined shape, so a split stated with `--tp-split` is written as faithfully as a recorded
one; `vocab_tensor` only where the checkpoint itself names the parameter vocabulary-parallel.

Native MoE is refused (`MOE_REASON`): DeepSpeed 0.19.8's loader reads every expert from
`zero/<its local parameter name>/`, so one folder would have to serve the expert each expert-parallel rank
holds in that slot (stacked, with `is_expert_param` and `ep_num_experts`), a layout no DeepSpeed tool writes
and this writer does not write yet.
"""

from __future__ import annotations

from typing import Any

from inspector.format.torchzip import load_tree
from inspector.parse.layers import TpRecipe
from inspector.parse.states import ModelStates
from inspector.scan.model import Checkpoint

Meta = tuple[tuple[str, Any], ...]
PLAIN: Meta = (("cat_dim", 0),)
ROW: Meta = (("cat_dim", 1),)
REPLICATED: Meta = ()
VOCAB: Meta = (("cat_dim", 0), ("vocab_tensor", True))

MOE_REASON = (
    "a native MoE (expert-parallel) checkpoint: DeepSpeed 0.19.8 loads a universal checkpoint's experts by "
    "their local names (deepspeed_experts.0 on every expert-parallel rank), so each folder would have to stack "
    "the experts all ranks hold in that slot; its own ds_to_universal fails on this layout, and writing that "
    "stacked form is not supported yet (export the weights instead)"
)

ZERO_OFF_REASON = (
    "ZeRO off (BF16_Optimizer at stage 0): DeepSpeed 0.19.8 reads a universal checkpoint's zero/ folder only "
    "when ZeRO is on (engine.load_checkpoint skips it at stage 0), so nothing of it would be resumed"
)


def tp_metadata(ckpt: Checkpoint) -> dict[str, Meta]:
    """Per joined parameter, the keys its universal files carry (empty for a layout that is not tensor
    parallel: every file then gets `cat_dim` 0, as for a data-parallel checkpoint)."""
    if ckpt.parallel is None or ckpt.parallel.kind != "tensor":
        return {}
    model0 = next((f.path for f in ckpt.files if f.role == "model" and f.mp_rank == 0), None)
    if model0 is None:
        return {}
    tree = load_tree(model0, ckpt.source)
    states = ModelStates.parse(tree, model0)
    recipe = TpRecipe.parse(tree, model0)
    vocab = {n for n, rule in (recipe.rules.items() if recipe else ()) if rule == "vocab"}
    shard = {name: shape for group in states.param_shapes or () for name, shape in group}
    out: dict[str, Meta] = {}
    for t in ckpt.tensors:
        piece = shard.get(t.name)
        if piece is None:
            continue
        if t.name in vocab:
            out[t.name] = VOCAB
        elif tuple(piece) == tuple(t.shape):
            out[t.name] = REPLICATED
        elif len(piece) > 1 and len(t.shape) > 1 and piece[1] != t.shape[1]:
            out[t.name] = ROW
        else:
            out[t.name] = PLAIN
    return out
