"""Resume from a universal checkpoint with real DeepSpeed (any world size) and record what it loaded.

    DS_ACCELERATOR=cpu torchrun --nproc_per_node 3 ds_resume.py LOAD_DIR OUT.pt <ds_train.py options>

Writes, from rank 0, every trainable parameter's fp32 master and Adam moments as DeepSpeed sees them after
`load_checkpoint` with `load_universal`, the optimizer steps, then trains one more step and records the loss.
"""

from __future__ import annotations

import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ds_train import build, leave, live_state, parser, train


def main() -> None:
    ap = parser()
    ap.add_argument("result")
    args = ap.parse_args()
    if args.round_robin and not args.param_alignment:
        # DeepSpeed 0.19.8 maps fragments in the original order while a round-robin buffer without
        # alignment padding is reordered (FORMAT.md §3.2): its loader would misplace any correct
        # checkpoint. Round robin only changes gradient partitioning, so resume without it.
        args.round_robin = False
    engine = build(args, load_universal=True)
    path, _ = engine.load_checkpoint(args.out)
    if path is None:
        raise SystemExit(f"load_checkpoint found nothing under {args.out}")
    state = live_state(engine)
    loss = train(engine, args.grad_accum, 100 + int(os.environ.get("RANK", "0")))
    state["loss_after"] = torch.tensor(loss)
    state["global_steps_after"] = torch.tensor(engine.global_steps)
    if int(os.environ.get("RANK", "0")) == 0:
        torch.save(state, args.result)
    leave()


if __name__ == "__main__":
    main()
