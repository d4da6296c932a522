"""Train a small MLP with real DeepSpeed until it diverges, saving a tag after every step.

The learning rate starts sound and is multiplied by `--growth` after every step, the way a run goes when its
schedule is wrong: the weights, then the gradients and Adam's moments grow. Gradient clipping is off (on,
DeepSpeed's default clips to norm 1.0 and the moments stay small). DeepSpeed skips every step whose gradients
overflow, so growth alone never puts NaN in the masters: once the loss overflows, the later tags hold the
same weights. `--inf-lr-at STEP` makes the learning rate inf from that step on (a schedule that overflowed):
that step's update is what writes Inf and NaN into the masters. Run under torchrun (gloo), as ds_train.py:
    DS_ACCELERATOR=cpu torchrun --nproc_per_node 2 ds_diverge.py OUT --steps 8 --inf-lr-at 6
Rank 0 writes OUT/../diverge.json: each step's tag, learning rate and loss, for the test to read.
"""

from __future__ import annotations

import argparse
import json
import math
import os

import torch
from ds_train import leave  # run as a script, this folder is on sys.path
from torch import nn


class Mlp(nn.Module):
    """Three numbered blocks and an embedding, no normalisation: nothing holds the activations back, so the
    gradients grow with the weights as a diverging run's do."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(37, 16)
        self.layers = nn.ModuleList(nn.Linear(16, 16) for _ in range(3))
        self.head = nn.Linear(16, 37)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.emb(x).mean(1)
        for layer in self.layers:
            h = torch.relu(layer(h)) + h
        return self.head(h)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--stage", type=int, default=2)
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--lr", type=float, default=1e-2)
    ap.add_argument("--growth", type=float, default=10.0, help="the learning rate's factor after each step")
    ap.add_argument("--dtype", choices=["bf16", "fp32"], default="bf16")
    ap.add_argument("--save-every", type=int, default=1)
    ap.add_argument(
        "--inf-lr-at",
        type=int,
        default=0,
        help="from this step the learning rate is inf (a schedule that overflowed)",
    )
    args = ap.parse_args()

    import deepspeed

    torch.manual_seed(1234)
    model = Mlp()
    config = {
        "train_micro_batch_size_per_gpu": 4,
        "optimizer": {"type": "Adam", "params": {"lr": args.lr, "torch_adam": True}},
        "zero_optimization": {"stage": args.stage},
        "bf16": {"enabled": args.dtype == "bf16"},
        "gradient_clipping": 0.0,  # DeepSpeed clips to norm 1.0 unless told: the moments would stay small
        "steps_per_print": 10_000,
    }
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
    rank = int(os.environ.get("RANK", "0"))
    g = torch.Generator().manual_seed(rank)
    lr, log = args.lr, []
    for step in range(1, args.steps + 1):
        x = torch.randint(0, 37, (4, 5), generator=g)
        loss = engine(x).float().pow(2).mean()
        engine.backward(loss)
        engine.step()
        tag = f"global_step{step}"
        if step % args.save_every == 0:
            engine.save_checkpoint(args.out, tag=tag)
        log.append(
            {"tag": tag, "lr": lr, "loss": float(loss) if math.isfinite(float(loss)) else str(float(loss))}
        )
        lr = math.inf if args.inf_lr_at and step + 1 >= args.inf_lr_at else lr * args.growth
        for group in engine.optimizer.param_groups:
            group["lr"] = lr
    if rank == 0:
        with open(os.path.join(os.path.dirname(os.path.abspath(args.out)), "diverge.json"), "w") as fh:
            json.dump(log, fh, indent=1)
    leave()


if __name__ == "__main__":
    main()
