"""Train a tiny model with real DeepSpeed on the CPU and save a ZeRO checkpoint.

Run under torchrun (gloo); the interop tests use the result as ground truth.
    DS_ACCELERATOR=cpu torchrun --nproc_per_node 2 ds_train.py OUT --stage 2 --dtype bf16
"""

from __future__ import annotations

import argparse
import os

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


def main() -> None:
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
    args = ap.parse_args()

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

    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=params, config=config)
    g = torch.Generator().manual_seed(int(os.environ.get("RANK", "0")))
    for _ in range(args.steps * args.grad_accum):  # engine.step() only steps at accumulation boundaries
        x = torch.randint(0, 37, (4, 5), generator=g)
        out = engine(x)
        loss = out.float().pow(2).mean()
        engine.backward(loss)
        engine.step()
    engine.save_checkpoint(args.out, tag=args.tag)


if __name__ == "__main__":
    main()
