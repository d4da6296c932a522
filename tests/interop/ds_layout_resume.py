"""Resume, in real DeepSpeed, a universal checkpoint written from a model-parallel layout fixture, at another
layout, and record what the engine loaded.

    DS_ACCELERATOR=cpu torchrun --nproc_per_node 2 ds_layout_resume.py tp   LOAD_DIR RESULT.pt --tp 1
    DS_ACCELERATOR=cpu torchrun --nproc_per_node 2 ds_layout_resume.py pipe LOAD_DIR RESULT.pt --stages 1
    DS_ACCELERATOR=cpu torchrun --nproc_per_node 2 ds_layout_resume.py tp   LOAD_DIR RESULT.pt --model phi3
    DS_ACCELERATOR=cpu torchrun --nproc_per_node 2 ds_layout_resume.py tp   LOAD_DIR RESULT.pt --tp 2 --zero 3
    DS_ACCELERATOR=cpu torchrun --nproc_per_node 2 ds_layout_resume.py pptp LOAD_DIR RESULT.pt --stages 1 --tp 2

The model is the one the fixture's script trained (tests/fixtures/layouts/make_tp.py: a tiny Llama or Phi-3;
make_pipe.py: the tied-embedding PipelineModule; make_pipe_tp.py: the PipelineModule with hand-made tensor-parallel
layers, over a topology of --stages x --tp), built with `"checkpoint": {"load_universal": true}`. A tensor-parallel
target's shards are put together again on rank 0 by the layer that split them (make_pipe_tp's ROW / REPLICATED, or
AutoTP's split of make_tp's Llama). Rank 0 writes every
trainable parameter's full fp32 master and Adam moments as DeepSpeed holds them after `load_checkpoint`
(`fp32/NAME`, `exp_avg/NAME`, `exp_avg_sq/NAME`, gathered over the data-parallel ranks and the stages), the
optimizer steps, `global_steps`, then the loss of one more training step and the steps after it.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

import torch

LAYOUTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fixtures", "layouts")
sys.path.insert(0, LAYOUTS)


def _tp_engine(args: argparse.Namespace, config: dict[str, Any]) -> Any:
    import deepspeed
    from make_tp import _model

    model = _model(args.model)  # make_tp.py's model
    if args.tp > 1:
        config["tensor_parallel"] = {"autotp_size": args.tp}
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
    return engine


def _pipe_engine(args: argparse.Namespace, config: dict[str, Any]) -> Any:
    import deepspeed
    import deepspeed.comm as dist
    from deepspeed.pipe import PipelineModule
    from make_pipe import _loss, layers

    dp = dist.get_world_size() // args.stages
    model = PipelineModule(layers(), num_stages=args.stages, loss_fn=_loss, partition_method="uniform")
    config.update(gradient_accumulation_steps=2, train_batch_size=4 * dp)
    params = [p for p in model.parameters() if p.requires_grad]
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=params, config=config)
    return engine


def _pptp_engine(args: argparse.Namespace, config: dict[str, Any]) -> Any:
    import deepspeed
    import deepspeed.comm as dist
    import make_pipe_tp
    from deepspeed.pipe import PipelineModule
    from deepspeed.runtime.pipe.topology import PipeModelDataParallelTopology

    dp = dist.get_world_size() // (args.stages * args.tp)
    topo = PipeModelDataParallelTopology(num_pp=args.stages, num_mp=args.tp, num_dp=dp)
    os.environ["ZI_TP_RANK"], os.environ["ZI_TP"] = str(topo.get_coord(dist.get_rank()).model), str(args.tp)
    model = PipelineModule(
        make_pipe_tp.layers(), topology=topo, loss_fn=make_pipe_tp._loss, partition_method="uniform"
    )
    make_pipe_tp.TP_GROUP = model._grid.get_slice_parallel_group()
    config.update(gradient_accumulation_steps=2, train_batch_size=4 * dp)
    params = [p for p in model.parameters() if p.requires_grad]
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=params, config=config)
    return engine


# how AutoTP splits make_tp.py's Llama (its universal_checkpoint_info): row-parallel on dim 1, replicated, the
# rest (lm_head's 40 vocabulary rows: no padding over 2 ranks) on dim 0
AUTOTP_ROW = ("self_attn.o_proj.weight", "mlp.down_proj.weight")
AUTOTP_REPLICATED = ("embed_tokens.weight", "norm.weight")


def _joined(state: dict[str, Any], tp: int, autotp: bool = False) -> None:
    """A tensor-parallel target's `STATE/shard/T/NAME` entries joined into `STATE/NAME` on rank 0, as
    make_pipe_tp.py's layers split them, or AutoTP splits make_tp.py's Llama (replicated shards must agree)."""
    from make_pipe_tp import REPLICATED, ROW

    for key in sorted(k for k in state if "/shard/0/" in k):
        kind, name = key.split("/shard/0/")
        parts = [state.pop(f"{kind}/shard/{t}/{name}") for t in range(tp)]
        replicated = name.endswith(AUTOTP_REPLICATED) if autotp else name in REPLICATED
        row = name.endswith(AUTOTP_ROW) if autotp else name in ROW
        if replicated:
            if any(not torch.equal(parts[0], p) for p in parts[1:]):
                raise SystemExit(f"replicated {name} ({kind}) differs between tensor-parallel ranks")
            state[f"{kind}/{name}"] = parts[0]
        else:
            state[f"{kind}/{name}"] = torch.cat(parts, dim=1 if row else 0)


def _moe_engine(args: argparse.Namespace, config: dict[str, Any]) -> Any:
    import deepspeed
    from deepspeed.moe.utils import split_params_into_different_moe_groups_for_optimizer
    from make_moe import Net

    model = Net(args.ep, args.second_ep)
    params = split_params_into_different_moe_groups_for_optimizer(
        {"params": list(model.parameters()), "name": "dense"}
    )
    config["train_micro_batch_size_per_gpu"] = 4
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=params, config=config)
    return engine


def _train_one(kind: str, engine: Any) -> float:
    g = torch.Generator().manual_seed(100)
    if kind == "moe":
        loss = engine(torch.randint(0, 37, (4, 5), generator=g))
        engine.backward(loss)
        engine.step()
        return float(loss)
    if kind in ("pipe", "pptp"):

        def batches() -> Any:
            while True:
                yield torch.randint(0, 37, (2, 5), generator=g), torch.zeros(2)

        return float(engine.train_batch(data_iter=batches()))
    x = torch.randint(0, 40, (2, 6), generator=g)
    loss = engine(input_ids=x, labels=x).loss
    engine.backward(loss)
    engine.step()
    return float(loss.detach())


def _loaded(engine: Any, shard: str = "") -> dict[str, Any]:
    """This rank's view of every parameter it holds (full, gathered over its data-parallel group); `shard`
    (`shard/T/`) marks a tensor-parallel rank's pieces."""
    from deepspeed.utils import safe_get_full_fp32_param, safe_get_full_optimizer_state
    from make_moe import global_name

    out: dict[str, Any] = {}
    for local, p in engine.module.named_parameters():
        if not p.requires_grad:
            continue
        n = shard + global_name(local, engine.module)  # an expert under its global index
        out[f"fp32/{n}"] = safe_get_full_fp32_param(p).detach().float().clone()
        for m in ("exp_avg", "exp_avg_sq"):
            out[f"{m}/{n}"] = safe_get_full_optimizer_state(p, m).detach().float().clone()
    steps = {float(s["step"]) for s in engine.optimizer.optimizer.state.values() if "step" in s}
    out["steps"] = sorted(steps)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("kind", choices=["tp", "pipe", "pptp", "moe"])
    ap.add_argument("load")
    ap.add_argument("result")
    ap.add_argument("--tp", type=int, default=1)
    ap.add_argument("--model", choices=["llama", "phi3", "experts"], default="llama")
    ap.add_argument("--stages", type=int, default=1)
    ap.add_argument("--ep", type=int, default=2)
    ap.add_argument("--second-ep", type=int, default=0)
    ap.add_argument("--zero", type=int, default=1)
    ap.add_argument("--dtype", choices=["bf16", "fp16"], default="bf16")
    ap.add_argument("--steps", type=int, default=0)  # made.options' field; unused here
    args = ap.parse_args()
    import deepspeed.comm as dist
    import made

    made.start(args.dtype)
    config = made.config(args, 2, checkpoint={"load_universal": True})
    build = {"tp": _tp_engine, "pipe": _pipe_engine, "pptp": _pptp_engine, "moe": _moe_engine}[args.kind]
    engine = build(args, config)
    made.resume(engine, args.load)
    shard = f"shard/{os.environ['ZI_TP_RANK']}/" if args.kind == "pptp" and args.tp > 1 else ""
    if args.kind == "tp" and args.tp > 1:  # AutoTP: each rank holds its shard of the split parameters
        from deepspeed.utils import groups

        shard = f"shard/{groups.get_tensor_model_parallel_rank()}/"
    mine = _loaded(engine, shard)
    mine["global_steps"] = int(engine.global_steps)
    got: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(got, mine)
    loss = _train_one(args.kind, engine)
    if dist.get_rank() == 0:
        state = made.merged(got)
        if args.kind in ("pptp", "tp") and args.tp > 1:
            _joined(state, args.tp, autotp=args.kind == "tp")
        state["loss_after"] = loss
        state["global_steps_after"] = int(engine.global_steps)
        torch.save(state, args.result)
    dist.barrier()


if __name__ == "__main__":
    main()
