"""Train a tiny Llama-style causal LM a few steps under Hugging Face Trainer with DeepSpeed on the CPU.

Run under torchrun (gloo, DS_ACCELERATOR=cpu). Writes OUT/run (Trainer's output_dir, with checkpoint-N/
inside), OUT/base (the untrained model saved with save_pretrained: the base a LoRA run names) and
OUT/tokenizer (a WordLevel tokenizer trained here: nothing is downloaded).
    DS_ACCELERATOR=cpu torchrun --nproc_per_node 2 hf_train.py OUT --stage 3
    DS_ACCELERATOR=cpu torchrun --nproc_per_node 2 hf_train.py OUT --stage 2 --lora
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

TEXTS = [
    "the quick brown fox jumps over the lazy dog",
    "a zero checkpoint holds every rank of the optimizer",
    "deepspeed splits the fp32 masters across the ranks",
    "hello world from a tiny llama trained on the cpu",
] * 4


def make_tokenizer(path: str) -> object:
    """A WordLevel tokenizer trained here, so nothing is downloaded; saved with save_pretrained."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train_from_iterator(
        TEXTS, trainers.WordLevelTrainer(special_tokens=["[UNK]", "[PAD]", "<s>", "</s>"])
    )
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token="[UNK]", pad_token="[PAD]", bos_token="<s>", eos_token="</s>"
    )
    fast.chat_template = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    fast.save_pretrained(path)
    return fast


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--stage", type=int, default=3)
    ap.add_argument("--lora", action="store_true")
    ap.add_argument("--rslora", action="store_true")
    ap.add_argument("--steps", type=int, default=3)
    args = ap.parse_args()

    from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments

    rank = int(os.environ.get("RANK", "0"))
    base_dir = os.path.join(args.out, "base")
    tok_dir = os.path.join(args.out, "tokenizer")
    tok = make_tokenizer(tok_dir) if rank == 0 else None
    torch.manual_seed(1234)
    config = LlamaConfig(
        vocab_size=40,
        hidden_size=32,
        intermediate_size=44,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        tie_word_embeddings=not args.lora,
        bos_token_id=2,
        eos_token_id=3,
        pad_token_id=1,
    )
    ds: dict = {
        "zero_optimization": {"stage": args.stage},
        "bf16": {"enabled": True},
        "optimizer": {"type": "AdamW", "params": {"lr": "auto", "torch_adam": True, "weight_decay": 0.0}},
        "train_micro_batch_size_per_gpu": "auto",
        "gradient_accumulation_steps": "auto",
        "train_batch_size": "auto",
        "gradient_clipping": "auto",
    }
    targs = TrainingArguments(
        output_dir=os.path.join(args.out, "run"),
        per_device_train_batch_size=2,
        max_steps=args.steps,
        save_steps=args.steps,
        save_strategy="steps",
        learning_rate=5e-2,
        bf16=True,
        deepspeed=ds,
        report_to=[],
        logging_steps=1,
        dataloader_num_workers=0,
        seed=1234,
        use_cpu=True,
    )
    model = LlamaForCausalLM(config)
    if rank == 0:
        model.save_pretrained(base_dir)  # fp32 base: the folder a LoRA run's adapter_config names
    if args.lora:
        from peft import LoraConfig, get_peft_model

        lcfg = LoraConfig(
            r=4,
            lora_alpha=8,
            target_modules=["q_proj", "v_proj", "up_proj"],
            lora_dropout=0.0,
            use_rslora=args.rslora,
            task_type="CAUSAL_LM",
            init_lora_weights=True,
        )
        model.name_or_path = os.path.abspath(base_dir)  # what PEFT records as base_model_name_or_path
        model = get_peft_model(model, lcfg)
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tok_dir) if tok is None else tok
    g = torch.Generator().manual_seed(rank)
    rows = []
    for _ in range(16):
        ids = torch.randint(4, 40, (12,), generator=g)
        rows.append({"input_ids": ids, "labels": ids.clone(), "attention_mask": torch.ones_like(ids)})
    trainer = Trainer(model=model, args=targs, train_dataset=rows, processing_class=tok)
    trainer.train()
    # gloo's threads sometimes abort the interpreter's teardown ("terminate called without an active
    # exception") after everything is saved; leave through a clean barrier and skip that teardown
    import torch.distributed as dist

    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
