"""Resume, in real DeepSpeed, a universal checkpoint of an AutoEP fixture and record what the engine loaded.

    DS_ACCELERATOR=cpu torchrun --nproc_per_node 2 ds_autoep_resume.py LOAD_DIR RESULT.pt --zero 3 --ep 2

The model is make_autoep.py's tiny Mixtral with `expert_parallel` and `"checkpoint": {"load_universal": true}`.
Rank 0 writes every trainable parameter's full fp32 master and Adam moments as DeepSpeed holds them after
`load_checkpoint` (`fp32/NAME`, `exp_avg/NAME`, `exp_avg_sq/NAME`; an AutoEP expert tensor's slices under
`NAME/<global expert>`, from the layer's own placement record, as make_autoep.py records them) and the steps.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

import torch

LAYOUTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fixtures", "layouts")
sys.path.insert(0, LAYOUTS)


def _experts(engine: Any) -> dict[str, list[int]]:
    """Per AutoEP layer (module path), the global experts this rank holds, in local order."""
    from deepspeed.checkpoint.autoep_affine import autoep_experts_for_rank

    return {
        name: list(autoep_experts_for_rank(mod.expert_placement_descriptor, mod.ep_rank))
        for name, mod in engine.module.named_modules()
        if hasattr(mod, "expert_placement_descriptor") and hasattr(mod, "ep_rank")
    }


def _loaded(engine: Any) -> dict[str, Any]:
    import deepspeed
    from deepspeed.utils import safe_get_full_fp32_param, safe_get_full_optimizer_state

    experts, out = _experts(engine), {}
    params = [(n, p) for n, p in engine.module.named_parameters() if p.requires_grad]
    with deepspeed.zero.GatheredParameters([p for _, p in params]):
        for n, p in params:
            got = {"fp32": safe_get_full_fp32_param(p)}
            got.update({m: safe_get_full_optimizer_state(p, m) for m in ("exp_avg", "exp_avg_sq")})
            owner = next((m for m in experts if n.startswith(m + ".experts.")), None)
            for state, value in got.items():
                value = value.detach().float().clone()
                if owner is None:
                    out[f"{state}/{n}"] = value
                    continue
                for j, k in enumerate(experts[owner]):
                    out[f"{state}/{n}/{k}"] = value[j].clone()
    out["steps"] = sorted(
        {float(s["step"]) for s in engine.optimizer.optimizer.state.values() if "step" in s}
    )
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("load")
    ap.add_argument("result")
    ap.add_argument("--zero", type=int, default=3)
    ap.add_argument("--ep", type=int, default=2)
    ap.add_argument("--dtype", choices=["bf16", "fp16"], default="bf16")
    ap.add_argument("--steps", type=int, default=0)  # made.options' field; unused here
    args = ap.parse_args()
    import deepspeed
    import deepspeed.comm as dist
    import made
    from make_autoep import shim_transformers_registry, tiny_mixtral

    made.start(args.dtype)
    shim_transformers_registry()
    model = tiny_mixtral()
    config = made.config(
        args,
        2,
        expert_parallel={"enabled": True, "autoep_size": args.ep, "preset_model": "mixtral"},
        checkpoint={"load_universal": True},
    )
    if args.zero == 3:
        config["zero_optimization"]["stage3_param_persistence_threshold"] = 0
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
    made.resume(engine, args.load)
    mine = _loaded(engine)
    got: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(got, mine)
    if dist.get_rank() == 0:
        state = made.merged(got)
        state["global_steps"] = int(engine.global_steps)
        torch.save(state, args.result)
    dist.barrier()


if __name__ == "__main__":
    main()
