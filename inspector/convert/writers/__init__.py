"""Output writers other than the safetensors engine (universal checkpoints)."""
