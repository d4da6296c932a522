"""zero-inspector: read DeepSpeed ZeRO checkpoints without deepspeed, and convert them with flat memory."""

__version__ = "0.1.0"
