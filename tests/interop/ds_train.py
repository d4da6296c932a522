"""Train a tiny model with real DeepSpeed on the CPU and save a ZeRO checkpoint.

Run under torchrun (gloo); the interop tests use the result as ground truth.
    DS_ACCELERATOR=cpu torchrun --nproc_per_node 2 ds_train.py OUT --stage 2 --dtype bf16
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

import torch
from torch import nn


class Tiny(nn.Module):
    """Odd sizes so partitions need padding; optional frozen, tied and extra buffers."""

    def __init__(self, frozen: bool, tied: bool) -> None:
        super().__init__()
        self.emb = nn.Embedding(37, 16)
        self.l1 = nn.Linear(16, 33)
        self.norm = nn.LayerNorm(33)
        self.l2 = nn.Linear(33, 37)
        self.register_buffer("seen", torch.zeros((), dtype=torch.long))
        self.register_buffer("running", torch.zeros(33))
        self.register_buffer("scale", torch.linspace(0.5, 1.5, 7))
        if frozen:
            self.frozen = nn.Linear(16, 11)
            for p in self.frozen.parameters():
                p.requires_grad_(False)
        if tied:
            self.head = nn.Linear(16, 37, bias=False)
            self.head.weight = self.emb.weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.emb(x).mean(1)
        z = self.norm(torch.relu(self.l1(h)))
        if self.training:
            self.seen += 1
            self.running.mul_(0.9).add_(0.1 * z.detach().mean(0).to(self.running.dtype))
        out = self.l2(z) * self.scale.mean()
        if hasattr(self, "frozen"):
            out = out + self.frozen(h).sum(-1, keepdim=True)
        if hasattr(self, "head"):
            out = out + self.head(h)
        return out


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--stage", type=int, default=2)
    ap.add_argument("--dtype", choices=["bf16", "fp16", "fp32"], default="bf16")
    ap.add_argument("--frozen", action="store_true")
    ap.add_argument("--tied", action="store_true")
    ap.add_argument("--groups", type=int, default=1)
    ap.add_argument("--bf16-optimizer", action="store_true", help="grad_accum_dtype fp32 (BF16_Optimizer)")
    ap.add_argument("--round-robin", action="store_true")
    ap.add_argument("--param-alignment", action="store_true")
    ap.add_argument("--sub-group-size", type=int, default=0)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--grad-accum", type=int, default=1, help="gradient_accumulation_steps")
    ap.add_argument(
        "--scale-power", type=int, default=8, help="fp16 initial_scale_power (high: early steps overflow)"
    )
    ap.add_argument("--tag", default=None)
    return ap


def build(args: argparse.Namespace, load_universal: bool = False) -> Any:
    """The engine for these options (the same model, groups and config every time)."""
    import deepspeed
    from deepspeed.accelerator import get_accelerator

    if args.dtype == "fp16":
        type(get_accelerator()).is_fp16_supported = lambda self: True

    torch.manual_seed(1234)
    model = Tiny(args.frozen, args.tied)
    trainable = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    if args.groups == 2:
        decay = [p for n, p in trainable if n.endswith("weight") and "norm" not in n]
        no_decay = [p for n, p in trainable if not (n.endswith("weight") and "norm" not in n)]
        params = [{"params": decay, "weight_decay": 0.01}, {"params": no_decay, "weight_decay": 0.0}]
    else:
        params = [p for _, p in trainable]

    zero: dict = {"stage": args.stage}
    if args.round_robin:
        zero["round_robin_gradients"] = True
    if args.param_alignment:
        zero["parameter_alignment"] = True
    if args.sub_group_size:
        zero["sub_group_size"] = args.sub_group_size
    config: dict = {
        "train_micro_batch_size_per_gpu": 4,
        "gradient_accumulation_steps": args.grad_accum,
        "optimizer": {"type": "Adam", "params": {"lr": 1e-2, "torch_adam": True}},
        "zero_optimization": zero,
        "steps_per_print": 10_000,
    }
    if args.dtype == "bf16":
        config["bf16"] = {"enabled": True}
    elif args.dtype == "fp16":
        config["fp16"] = {"enabled": True, "initial_scale_power": args.scale_power}
        if args.scale_power != 8:  # overflow runs: recover quickly so later steps really update
            config["fp16"]["loss_scale_window"] = 2
    if args.bf16_optimizer:
        config["data_types"] = {"grad_accum_dtype": "fp32"}
    if load_universal:
        config["checkpoint"] = {"load_universal": True}

    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=params, config=config)
    return engine


def train(engine: Any, steps: int, seed: int) -> float:
    g = torch.Generator().manual_seed(seed)
    loss = torch.zeros(())
    for _ in range(steps):
        x = torch.randint(0, 37, (4, 5), generator=g)
        out = engine(x)
        loss = out.float().pow(2).mean()
        engine.backward(loss)
        engine.step()
    return float(loss)


def _flat_truth(engine: Any) -> dict[str, Any]:
    """Stage 1/2 masters and moments cut from the gathered flat groups in the engine's *real* buffer order
    (`round_robin_bit16_groups` at `round_robin_bit16_offsets`). DeepSpeed's accessors use `_hp_mapping`,
    which 0.19.8 builds in the original order when round robin has no alignment padding (FORMAT.md §3.2),
    and `safe_get_full_optimizer_state` fails right after training on a rank whose fp32 partition is
    trimmed; the flat groups themselves are the truth."""
    import deepspeed.comm as dist

    zopt = engine.optimizer
    names = {id(p): n for n, p in engine.module.named_parameters()}
    out: dict[str, Any] = {}
    for i, params in enumerate(zopt.round_robin_bit16_groups):
        group = zopt.real_dp_process_group[i]
        ws = dist.get_world_size(group=group)
        part = zopt.bit16_groups_flat[i].numel() // ws
        hp = zopt.single_partition_of_fp32_groups[i]
        state = zopt.optimizer.state[zopt.optimizer.param_groups[i]["params"][0]]
        for key, local in (("fp32", hp), ("exp_avg", state["exp_avg"]), ("exp_avg_sq", state["exp_avg_sq"])):
            padded = torch.zeros(part, dtype=torch.float32)
            padded[: local.numel()] = local.detach().float().flatten()
            pieces = [torch.zeros_like(padded) for _ in range(ws)]
            dist.all_gather(pieces, padded, group=group)
            flat = torch.cat(pieces)
            for p, off in zip(params, zopt.round_robin_bit16_offsets[i], strict=True):
                out[f"{names[id(p)]}/{key}"] = flat[off : off + p.numel()].clone().view(p.shape)
    return out


def live_state(engine: Any, accessor: bool = True) -> dict[str, Any]:
    """What the engine holds now: DeepSpeed's own accessors, or (accessor=False, stage 1/2 ZeRO optimizer)
    the flat groups in their real order. Collectives: every rank calls."""
    from deepspeed.utils import safe_get_full_fp32_param, safe_get_full_optimizer_state

    out: dict[str, Any] = {}
    if not accessor and hasattr(engine.optimizer, "round_robin_bit16_offsets"):
        out.update(_flat_truth(engine))
    else:
        for name, p in engine.module.named_parameters():
            if not p.requires_grad:
                continue
            out[f"{name}/fp32"] = safe_get_full_fp32_param(p).detach().clone()
            for key in ("exp_avg", "exp_avg_sq"):
                out[f"{name}/{key}"] = safe_get_full_optimizer_state(p, key).detach().clone()
    opt = engine.optimizer.optimizer
    steps = [float(s["step"]) for s in opt.state.values() if isinstance(s, dict) and "step" in s]
    out["steps"] = torch.tensor(sorted(set(steps)), dtype=torch.float64)
    out["global_steps"] = torch.tensor(engine.global_steps)
    return out


def main() -> None:
    args = parser().parse_args()
    engine = build(args)
    train(engine, args.steps * args.grad_accum, int(os.environ.get("RANK", "0")))  # engine.step() only steps at accumulation boundaries
    engine.save_checkpoint(args.out, tag=args.tag)
    live = live_state(
        engine, accessor=False
    )  # the truth a universal checkpoint must carry (round robin: not ds_to_universal's)
    if int(os.environ.get("RANK", "0")) == 0:
        torch.save(live, os.path.join(os.path.dirname(os.path.abspath(args.out)), "live.pt"))
    leave()


def leave() -> None:
    """Exit together and skip the interpreter's teardown: a rank that leaves while gloo still talks, or
    whose gloo threads outlive teardown, aborts ("terminate called without an active exception") after
    everything is saved (seen in a clean CI run on a resume to 3 ranks)."""
    import deepspeed.comm as dist

    dist.barrier()
    dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
